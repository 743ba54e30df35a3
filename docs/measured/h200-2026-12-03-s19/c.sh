# Session 19's third call (issue 10): the decode step's sparse MLA on mla_decode_wg2 (TILERT_GPU_MLA_WG=1; the sm_90a
# module's mla_prefill_wg2 block with the selections split over the SMs). Binaries of the working tree in .device/next.
# Usage: bash docs/measured/next/s19c.sh
#  checks: TestKernelMLADecodeWG2 (float64 bounds, == mla_prefill_wg2 unsplit, row bases, repeats, bad arguments),
#          TestKernelMLAPrefillWG2 (the prefill kernel after the shared block's change), the engine's TestGPUMLADecodeWG
#          (greedy == CPU and goldens with the switch) and TestGPUPrefillOnePartAllWG2;
#  timing: TestKernelTimingMLADecodeWG2 (graph-timed, tcf2 + combine against wg2 + combine at three splits);
#  steps:  both models, 1 and 4 slots at 8192, default against TILERT_GPU_MLA_WG=1.
set -x
if ls .device/next/*.xz >/dev/null 2>&1; then (cd .device/next && for f in *.xz; do xz -d -f "$f"; done); fi
chmod +x .device/next/* 2>/dev/null
D=$PWD/.device/next
R=/tmp/s19c; rm -rf $R; mkdir -p $R
export TILERT_KERNEL_CACHE=/tmp/tilert-kernels
save() { tar czf $OUT/s19c.tgz -C $R .; cp $R/summary.txt $OUT/summary-s19c.txt 2>/dev/null; }
bn() { local m=$1 c=$2 b=$3 n=$4; shift 4; env X=1 "$@" timeout 100 $D/tilert bench decode --device cuda --dummy-weights $m --layers 9 --context $c --batches $b > $R/$n.txt 2>&1; echo "rc=$?" >> $R/$n.txt; grep -E "^ +[0-9]+ +[0-9]+ +[0-9.]+ " $R/$n.txt | sed "s|^|$n $* |" | tee -a $R/summary.txt; save; }
timeout 120 $D/tilert bench decode --device cuda --dummy-weights glm-5 --layers 1 --context 1024 --batches 1,4 > $R/warm.txt 2>&1
(cd cuda/kernels && timeout 150 $D/kernels.test -test.v -test.count=1 -test.run 'TestKernelMLADecodeWG2$|TestKernelMLAPrefillWG2$' > $R/kernels.log 2>&1; echo "rc=$?" >> $R/kernels.log)
(cd cuda/kernels && TILERT_GPU_TIMING=1 timeout 100 $D/kernels.test -test.v -test.count=1 -test.run 'TestKernelTimingMLADecodeWG2' > $R/timing.log 2>&1; echo "rc=$?" >> $R/timing.log)
(cd engine/gpu && timeout 150 $D/engine.test -test.v -test.count=1 -test.run 'TestGPUMLADecodeWG|TestGPUPrefillOnePartAllWG2' > $R/engine.log 2>&1; echo "rc=$?" >> $R/engine.log)
grep "graph: mla_decode" $R/timing.log | cut -c1-200 >> $R/summary.txt
for f in kernels engine; do echo "$f: $(grep -c '^--- PASS' $R/$f.log) PASS, $(grep -c '^--- FAIL' $R/$f.log) FAIL, $(grep -c '^--- SKIP' $R/$f.log) SKIP; $(tail -1 $R/$f.log)" | tee -a $R/summary.txt; done
grep -E "FAIL|exceeds|bound" $R/kernels.log | head -20 >> $R/summary.txt; save
bn deepseek-v3.2 8192 1 ds-1
bn deepseek-v3.2 8192 1 ds-1-wg TILERT_GPU_MLA_WG=1
bn deepseek-v3.2 8192 4 ds-4
bn deepseek-v3.2 8192 4 ds-4-wg TILERT_GPU_MLA_WG=1
bn glm-5 8192 1 glm-1
bn glm-5 8192 1 glm-1-wg TILERT_GPU_MLA_WG=1
bn glm-5 8192 4 glm-4
bn glm-5 8192 4 glm-4-wg TILERT_GPU_MLA_WG=1
