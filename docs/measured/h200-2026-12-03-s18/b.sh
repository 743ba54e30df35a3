# Session 18's call B (issue 10): the second-iteration tensor-core GEMVs (cu/gemv_mma_x.cu, TILERT_GPU_GEMV_MMA=x),
# written in session 4 and never run. Call A's in-graph profile at 4 slots (8192) shows what they were built for:
# the grouped attention inputs at 4 rows take 40 us a layer in the graph (9.3 at 1 row; the tile group kernel,
# 416 GB/s) and the 4-row o_proj 41 us (34 at 1 row). Checks first (every x variant against the CPU reference and
# bit for bit within its generation), the engine's serving checks with every shape on x, then the steps.
# Also the attention epilogue in one launch across slots (attn_epilogue_rows; TILERT_GPU_EPI_ROWS=0 the launch per slot).
# Binaries: tilert, kernels.test, engine.test in .device/next (xz'd or not). ~7 min warm.
set -x
if ls .device/next/*.xz >/dev/null 2>&1; then (cd .device/next && for f in *.xz; do xz -d -f "$f"; done); fi
chmod +x .device/next/* 2>/dev/null
D=$PWD/.device/next; R=/tmp/s18x; rm -rf $R; mkdir -p $R
export TILERT_KERNEL_CACHE=/tmp/tilert-kernels
save() { tar czf $OUT/s18x.tgz -C $R .; cp $R/summary.txt $OUT/summary-x.txt 2>/dev/null; }
bn() { local m=$1 c=$2 b=$3 n=$4; shift 4; env X=1 "$@" timeout 100 $D/tilert bench decode --device cuda --dummy-weights $m --layers 9 --context $c --batches $b ${MTP:+--mtp} --json $R/$n.json > $R/$n.txt 2>&1; echo "rc=$?" >> $R/$n.txt; grep -E "^ +[0-9]+ +[0-9]+ +[0-9.]+ " $R/$n.txt | sed "s|^|$n $* |" | tee -a $R/summary.txt; save; }
timeout 120 $D/tilert bench decode --device cuda --dummy-weights glm-5 --layers 1 --context 1024 --batches 1,4 > $R/warm.txt 2>&1
TILERT_GPU_GEMV_MMA=x timeout 120 $D/tilert bench decode --device cuda --dummy-weights glm-5 --layers 1 --context 1024 --batches 1,4 > $R/warm-x.txt 2>&1
(cd cuda/kernels && TILERT_GPU_REPORT=$R/check-report.txt timeout 150 $D/kernels.test -test.v -test.count=1 -test.run 'TestKernelGemvMMA$|TestKernelGemvGroupMMA|TestKernelMMAVariantsBitwise|TestMMAShape|TestPDLKernelsWait|TestKernelFusedAttnEpilogueRows|TestKernelFusedAttnEpilogue$' > $R/check.log 2>&1; echo "rc=$?" >> $R/check.log)
echo "checks: $(grep -c '^--- PASS' $R/check.log) PASS, $(grep -c '^--- FAIL' $R/check.log) FAIL, $(grep -c '^--- SKIP' $R/check.log) SKIP; $(tail -1 $R/check.log)" | tee -a $R/summary.txt; save
(cd engine/gpu && timeout 120 $D/engine.test -test.v -test.count=1 -test.run '^TestGPU(SlotMergeEqualPerSlot|FusedEqualUnfused)$' > $R/engine-epi.log 2>&1; echo "rc=$?" >> $R/engine-epi.log)
echo "engine epi: $(grep -c '^--- PASS' $R/engine-epi.log) PASS, $(grep -c '^--- FAIL' $R/engine-epi.log) FAIL; $(tail -1 $R/engine-epi.log)" | tee -a $R/summary.txt; save
bn deepseek-v3.2 8192 4 ds-4
bn deepseek-v3.2 8192 4 ds-4-epi0 TILERT_GPU_EPI_ROWS=0
bn deepseek-v3.2 8192 4 ds-4-x TILERT_GPU_GEMV_MMA=x
bn deepseek-v3.2 8192 4 ds-4-g TILERT_GPU_GEMV_MMA=g
bn glm-5 8192 4 glm-4
bn glm-5 8192 4 glm-4-epi0 TILERT_GPU_EPI_ROWS=0
bn glm-5 8192 4 glm-4-g TILERT_GPU_GEMV_MMA=g
bn deepseek-v3.2 8192 1 ds-1
bn deepseek-v3.2 8192 1 ds-1-g1 TILERT_GPU_GEMV_MMA=g1
MTP=1 bn deepseek-v3.2 8192 1 ds-mtp
MTP=1 bn deepseek-v3.2 8192 1 ds-mtp-x TILERT_GPU_GEMV_MMA=x
(cd engine/gpu && TILERT_GPU_GEMV_MMA=xall timeout 150 $D/engine.test -test.v -test.count=1 -test.run '^TestGPU(GreedyMatchesCPU|CachesMatchCPU|LogitsMatchEmulator|PenaltiesMatchCPU|ForcedDrafts|GraphsEqualEager)$' > $R/engine-xall.log 2>&1; echo "rc=$?" >> $R/engine-xall.log)
echo "engine xall: $(grep -c '^--- PASS' $R/engine-xall.log) PASS, $(grep -c '^--- FAIL' $R/engine-xall.log) FAIL; $(tail -1 $R/engine-xall.log)" | tee -a $R/summary.txt; save
(cd cuda/kernels && TILERT_GPU_TIMING=1 timeout 90 $D/kernels.test -test.v -test.count=1 -test.run 'TestKernelMMATiming' > $R/timing.log 2>&1; echo "rc=$?" >> $R/timing.log)
grep "mma sweep\|group" $R/timing.log | cut -c1-400 >> $R/summary.txt; save
