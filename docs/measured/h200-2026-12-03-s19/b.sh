# Session 19's second call (issue 10): the attention-input group on gemv_mmx_group_u4 (fastest at every row count
# in s19.sh check's sweep) as the default. Binaries of the working tree in .device/next (xz'd or not).
# Usage: bash docs/measured/next/s19b.sh
#  checks: the group kernels against the float64 reference (TestKernelGemvGroupMMA), the engine's serving checks
#          with every shape on the tensor cores (=all: the tiny models' GEMVs are below the default's sizes) and with
#          the group from 2 rows (=g: the MTP verify's two rows);
#  steps:  MTP (2 rows a step) default / =g / =u2, 4 slots at 8192 default / =u2 (both models), DeepSeek-V3.2 4 slots
#          at 131072 default / late q fork (TILERT_GPU_SIDE_Q_AT=topk).
set -x
if ls .device/next/*.xz >/dev/null 2>&1; then (cd .device/next && for f in *.xz; do xz -d -f "$f"; done); fi
chmod +x .device/next/* 2>/dev/null
D=$PWD/.device/next
R=/tmp/s19b; rm -rf $R; mkdir -p $R
export TILERT_KERNEL_CACHE=/tmp/tilert-kernels
save() { tar czf $OUT/s19b.tgz -C $R .; cp $R/summary.txt $OUT/summary-s19b.txt 2>/dev/null; }
bn() { local m=$1 c=$2 b=$3 n=$4; shift 4; env X=1 "$@" timeout 100 $D/tilert bench decode --device cuda --dummy-weights $m --layers 9 --context $c --batches $b ${MTP:+--mtp} ${PROF:+--profile} > $R/$n.txt 2>&1; echo "rc=$?" >> $R/$n.txt; grep -E "^ +[0-9]+ +[0-9]+ +[0-9.]+ " $R/$n.txt | sed "s|^|$n $* |" | tee -a $R/summary.txt; save; }
timeout 120 $D/tilert bench decode --device cuda --dummy-weights glm-5 --layers 1 --context 1024 --batches 1,4 > $R/warm.txt 2>&1
(cd cuda/kernels && timeout 100 $D/kernels.test -test.v -test.count=1 -test.run 'TestKernelGemvGroupMMA' > $R/kernels.log 2>&1; echo "rc=$?" >> $R/kernels.log)
E='TestGPUSlotMergeEqualPerSlot|TestGPUForcedDrafts|TestGPUSampledMTPIdentical|TestGPUGreedyMatchesCPU$|TestGPUGolden$|TestGPUGraphsEqualEager|TestGPUSideStreamSameTokens|TestGPUFusedEqualUnfused|TestGPUPipelineMatches'
for m in all g; do (cd engine/gpu && TILERT_GPU_GEMV_MMA=$m timeout 150 $D/engine.test -test.v -test.count=1 -test.run "$E" > $R/engine-$m.log 2>&1; echo "rc=$?" >> $R/engine-$m.log); done
for f in kernels engine-all engine-g; do echo "$f: $(grep -c '^--- PASS' $R/$f.log) PASS, $(grep -c '^--- FAIL' $R/$f.log) FAIL, $(grep -c '^--- SKIP' $R/$f.log) SKIP; $(tail -1 $R/$f.log)" | tee -a $R/summary.txt; done; save
MTP=1 bn deepseek-v3.2 8192 1 ds-mtp
MTP=1 bn deepseek-v3.2 8192 1 ds-mtp-g TILERT_GPU_GEMV_MMA=g
MTP=1 bn deepseek-v3.2 8192 1 ds-mtp-u2 TILERT_GPU_GEMV_MMA=u2
bn deepseek-v3.2 8192 4 ds-4
bn deepseek-v3.2 8192 4 ds-4-u2 TILERT_GPU_GEMV_MMA=u2
bn glm-5 8192 4 glm-4
bn glm-5 8192 4 glm-4-u2 TILERT_GPU_GEMV_MMA=u2
bn deepseek-v3.2 131072 4 ds-4-long
bn deepseek-v3.2 131072 4 ds-4-long-topk TILERT_GPU_SIDE_Q_AT=topk
