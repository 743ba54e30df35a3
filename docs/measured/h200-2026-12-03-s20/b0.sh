# Session 20, call B0 (issue 10): the lead's two MLA-tail changes alone, before the helpers' merge:
# mla_decode_wg2b (mla_decode_wg2's bits, shorter chains) and absorb_v_comb (the one-row merge inside W_UV).
# Binaries of main (tilert, kernels.test, engine.test) in .device/next, xz'd or not. Usage: bash s20m.sh
set -x
if ls .device/next/*.xz >/dev/null 2>&1; then (cd .device/next && for f in *.xz; do xz -d -f "$f"; done); fi
chmod +x .device/next/* 2>/dev/null
D=$PWD/.device/next; R=/tmp/s20m; rm -rf $R; mkdir -p $R
export TILERT_KERNEL_CACHE=/tmp/tilert-kernels
save() { tar czf $OUT/s20m.tgz -C $R .; cp $R/summary.txt $OUT/summary.txt 2>/dev/null; }
bn() { local m=$1 c=$2 b=$3 n=$4; shift 4; env X=1 "$@" timeout 120 $D/tilert bench decode --device cuda --dummy-weights $m --layers 9 --context $c --batches $b ${PROF:+--profile} > $R/$n.txt 2>&1; echo "rc=$?" >> $R/$n.txt; grep -E "^ +[0-9]+ +[0-9]+ +[0-9.]+ " $R/$n.txt | sed "s|^|$n $* |" | tee -a $R/summary.txt; save; }
cnt() { echo "$1: $(grep -c '^--- PASS' $2) PASS, $(grep -c '^--- FAIL' $2) FAIL, $(grep -c '^--- SKIP' $2) SKIP; $(tail -1 $2)" | tee -a $R/summary.txt; grep -E "^--- FAIL" -A12 $2 | head -60 >> $R/summary.txt; }
timeout 120 $D/tilert bench decode --device cuda --dummy-weights glm-5 --layers 1 --context 1024 --batches 1 > $R/warm.txt 2>&1
(cd cuda/kernels && TILERT_GPU_TIMING=1 TILERT_GPU_PDL=1 timeout 200 $D/kernels.test -test.v -test.count=1 \
  -test.run 'TestKernelMLADecodeWG2$|TestKernelAbsorbVComb$|TestKernelAbsorbFast$|TestKernelTimingMLADecodeWG2|TestKernelTimingAbsorbVComb' > $R/kernels.log 2>&1; echo "rc=$?" >> $R/kernels.log)
cnt kernels $R/kernels.log; grep -E "^graph: " $R/kernels.log >> $R/summary.txt; grep -E "FAIL|differing|bits\)" $R/kernels.log | grep -v " 0 *0 *PASS" | head -30 >> $R/summary.txt; save
(cd engine/gpu && timeout 240 $D/engine.test -test.v -test.count=1 -test.run 'TestGPUMLAAbsorbComb$|TestGPUMLADecodeWG$' > $R/engine.log 2>&1; echo "rc=$?" >> $R/engine.log)
cnt engine $R/engine.log; grep -E "fused merge|mla_decode_wg2 ran" $R/engine.log >> $R/summary.txt; save
bn deepseek-v3.2 8192 1 ds-new
bn deepseek-v3.2 8192 1 ds-nocomb TILERT_GPU_ABSORB_COMB=0
bn deepseek-v3.2 8192 1 ds-wg2 TILERT_GPU_ABSORB_COMB=0 TILERT_GPU_MLA_WG2B=0
bn deepseek-v3.2 8192 1 ds-wg2b-plain TILERT_GPU_PDL_MORE=mla_decode_tcf,gemv_mid,absorb_v
bn glm-5 8192 1 glm-wg1 TILERT_GPU_MLA_WG=1
bn glm-5 8192 1 glm-new
bn deepseek-v3.2 131072 1 ds-long
bn glm-5 131072 1 glm-long-wg1 TILERT_GPU_MLA_WG=1
