# Session 20, call B (issue 10): the three latency changes of session 20 checked and stepped.
#  - mla_decode_wg2b (the lead): mla_decode_wg2's bits, shorter chains at one tile a block;
#  - the router GEMV + routing in one launch (helper route);
#  - the MoE combine + the next layer's add + RMSNorm in one launch (helper mcnorm).
# Binaries of main (tilert, kernels.test, engine.test) in .device/next, xz'd or not. Usage: bash s20b.sh
set -x
if ls .device/next/*.xz >/dev/null 2>&1; then (cd .device/next && for f in *.xz; do xz -d -f "$f"; done); fi
chmod +x .device/next/* 2>/dev/null
D=$PWD/.device/next; R=/tmp/s20b; rm -rf $R; mkdir -p $R
export TILERT_KERNEL_CACHE=/tmp/tilert-kernels
save() { tar czf $OUT/s20b.tgz -C $R .; cp $R/summary.txt $OUT/summary.txt 2>/dev/null; }
bn() { local m=$1 c=$2 b=$3 n=$4; shift 4; env X=1 "$@" timeout 120 $D/tilert bench decode --device cuda --dummy-weights $m --layers 9 --context $c --batches $b ${PROF:+--profile} > $R/$n.txt 2>&1; echo "rc=$?" >> $R/$n.txt; grep -E "^ +[0-9]+ +[0-9]+ +[0-9.]+ " $R/$n.txt | sed "s|^|$n $* |" | tee -a $R/summary.txt; save; }
cnt() { echo "$1: $(grep -c '^--- PASS' $2) PASS, $(grep -c '^--- FAIL' $2) FAIL, $(grep -c '^--- SKIP' $2) SKIP; $(tail -1 $2)" | tee -a $R/summary.txt; grep -E "^--- FAIL" -A8 $2 | head -40 >> $R/summary.txt; }
timeout 120 $D/tilert bench decode --device cuda --dummy-weights glm-5 --layers 1 --context 1024 --batches 1 > $R/warm.txt 2>&1
# Kernel checks (bits against the launches they replace) and graph timing.
(cd cuda/kernels && TILERT_GPU_TIMING=1 TILERT_GPU_PDL=1 timeout 300 $D/kernels.test -test.v -test.count=1 \
  -test.run "$KRUN" > $R/kernels.log 2>&1; echo "rc=$?" >> $R/kernels.log)
cnt kernels $R/kernels.log; grep -E "graph: |timing_test.go:162" $R/kernels.log | sed 's/^ *//' >> $R/timing.txt; save
# Engine: greedy == CPU etc. with the new defaults, and each switch's other side.
(cd engine/gpu && timeout 300 $D/engine.test -test.v -test.count=1 -test.run "$ERUN" > $R/engine.log 2>&1; echo "rc=$?" >> $R/engine.log)
cnt engine $R/engine.log; save
bn deepseek-v3.2 8192 1 ds-new
bn deepseek-v3.2 8192 1 ds-wg2 TILERT_GPU_MLA_WG2B=0
bn deepseek-v3.2 8192 1 ds-wg2b-plain TILERT_GPU_PDL_MORE=mla_decode_tcf,gemv_mid,absorb_v
bn deepseek-v3.2 8192 1 ds-noroute TILERT_GPU_ROUTE_FUSED=0
bn deepseek-v3.2 8192 1 ds-nonorm TILERT_GPU_MOE_NORM_FUSED=0
bn deepseek-v3.2 8192 1 ds-old TILERT_GPU_MLA_WG2B=0 TILERT_GPU_ROUTE_FUSED=0 TILERT_GPU_MOE_NORM_FUSED=0
bn glm-5 8192 1 glm-new
bn glm-5 8192 1 glm-wg1 TILERT_GPU_MLA_WG=1
bn glm-5 8192 1 glm-old TILERT_GPU_MLA_WG2B=0 TILERT_GPU_ROUTE_FUSED=0 TILERT_GPU_MOE_NORM_FUSED=0
bn deepseek-v3.2 131072 1 ds-long
bn glm-5 131072 1 glm-long
bn deepseek-v3.2 8192 4 ds-4
