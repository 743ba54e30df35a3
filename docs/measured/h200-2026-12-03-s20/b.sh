# Session 20, call B (issue 10): session 20's defaults checked and stepped.
#  - mla_decode_wg2b for one-tile blocks (the lead; checked in call B0);
#  - the router GEMV + routing in one launch (helper route, TILERT_GPU_ROUTE_FUSED);
#  - the MoE combine + the layer's closing add + RMSNorm in one cluster launch (helper mcnorm, TILERT_GPU_MOE_NORM_FUSED).
# Binaries of main (tilert, kernels.test, engine.test) in .device/next, xz'd or not. Usage: bash s20b.sh (~9 min cold)
set -x
if ls .device/next/*.xz >/dev/null 2>&1; then (cd .device/next && for f in *.xz; do xz -d -f "$f"; done); fi
chmod +x .device/next/* 2>/dev/null
D=$PWD/.device/next; R=/tmp/s20b; rm -rf $R; mkdir -p $R
export TILERT_KERNEL_CACHE=/tmp/tilert-kernels
save() { tar czf $OUT/s20b.tgz -C $R .; cp $R/summary.txt $OUT/summary.txt 2>/dev/null; }
bn() { local m=$1 c=$2 b=$3 n=$4; shift 4; env X=1 "$@" timeout 90 $D/tilert bench decode --device cuda --dummy-weights $m --layers 9 --context $c --batches $b ${PROF:+--profile} > $R/$n.txt 2>&1; echo "rc=$?" >> $R/$n.txt; grep -E "^ +[0-9]+ +[0-9]+ +[0-9.]+ " $R/$n.txt | sed "s|^|$n $* |" | tee -a $R/summary.txt; save; }
cnt() { echo "$1: $(grep -c '^--- PASS' $2) PASS, $(grep -c '^--- FAIL' $2) FAIL, $(grep -c '^--- SKIP' $2) SKIP; $(tail -1 $2)" | tee -a $R/summary.txt; grep -E "^--- FAIL" -A12 $2 | head -60 >> $R/summary.txt; }
timeout 120 $D/tilert bench decode --device cuda --dummy-weights glm-5 --layers 1 --context 1024 --batches 1 > $R/warm.txt 2>&1
# The engine's whole GPU part (gpu-check's engine half) beside the new kernels' checks.
(cd engine/gpu && timeout 300 $D/engine.test -test.v -test.count=1 -test.run '^TestGPU' > $R/engine.log 2>&1; echo "rc=$?" >> $R/engine.log) &
EP=$!
(cd cuda/kernels && timeout 200 $D/kernels.test -test.v -test.count=1 -test.run 'TestKernelRouterRoute$|TestKernelMoECombineNorm$|TestKernelSmallFast$|TestKernelMLADecodeWG2$|TestKernelMLAPrefillWG2$' > $R/kernels.log 2>&1; echo "rc=$?" >> $R/kernels.log)
cnt kernels $R/kernels.log; save
wait $EP
cnt engine $R/engine.log; grep -E "launches|ran [0-9]+ launches" $R/engine.log | head -20 >> $R/summary.txt; save
(cd cuda/kernels && TILERT_GPU_TIMING=1 timeout 100 $D/kernels.test -test.v -test.count=1 -test.run 'TestKernelTimingRouterRoute|TestKernelMoECombineNormTiming' > $R/timing.log 2>&1; echo "rc=$?" >> $R/timing.log)
grep -E "^graph|us " $R/timing.log | grep -v "^ *$" | head -40 >> $R/summary.txt; save
bn deepseek-v3.2 8192 1 ds-new
bn deepseek-v3.2 8192 1 ds-noroute TILERT_GPU_ROUTE_FUSED=0
bn deepseek-v3.2 8192 1 ds-nonorm TILERT_GPU_MOE_NORM_FUSED=0
bn glm-5 8192 1 glm-new
bn glm-5 8192 1 glm-old TILERT_GPU_ROUTE_FUSED=0 TILERT_GPU_MOE_NORM_FUSED=0
bn deepseek-v3.2 131072 1 ds-long
bn glm-5 131072 1 glm-long
bn deepseek-v3.2 8192 4 ds-4
