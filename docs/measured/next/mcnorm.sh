# Helper mcnorm's plan (session 20, issue 10; NOT RUN): the MoE combine fused with the layer's closing add + RMSNorm
# (moe_combine_norm_cl, TILERT_GPU_MOE_NORM_FUSED, default on). Binaries of the branch (tilert, kernels.test,
# engine.test; the build line in docs/measured/next/README.md), xz'd or not, in .device/next. ~6 min warm.
# Usage: bash docs/measured/next/mcnorm.sh
#  1. kernels: TestKernelMoECombineNorm (bit for bit against the two launches), TestKernelMoECombineNormTiming
#     (graph-timed; predicted ~2.5-3 us fused against ~5 us for the two), TestKernelSmallFast (add_rmsnorm_reg).
#  2. engine: TestGPUMoENormFusedEqual, TestGPUGreedyMatchesCPUMoENorm, and the default's greedy / golden checks.
#  3. steps at 8192, 1 and 4 slots, DeepSeek-V3.2 and GLM-5 dims, TILERT_GPU_MOE_NORM_FUSED=0 against the default,
#     and the 1-slot profile (the moeCombineNorm row against moeCombine + one addRMSNorm a layer).
set -x
if ls .device/next/*.xz >/dev/null 2>&1; then (cd .device/next && for f in *.xz; do xz -d -f "$f"; done); fi
chmod +x .device/next/* 2>/dev/null
D=$PWD/.device/next
R=/tmp/mcnorm; rm -rf $R; mkdir -p $R
export TILERT_KERNEL_CACHE=/tmp/tilert-kernels
save() { tar czf $OUT/mcnorm.tgz -C $R .; cp $R/summary.txt $OUT/summary-mcnorm.txt 2>/dev/null; }
bn() { local m=$1 c=$2 b=$3 n=$4; shift 4; env X=1 "$@" timeout 120 $D/tilert bench decode --device cuda --dummy-weights $m --layers 9 --context $c --batches $b ${PROF:+--profile} > $R/$n.txt 2>&1; echo "rc=$?" >> $R/$n.txt; grep -E "^ +[0-9]+ +[0-9]+ +[0-9.]+ " $R/$n.txt | sed "s|^|$n $* |" | tee -a $R/summary.txt; save; }
(cd cuda/kernels && TILERT_GPU_TIMING=1 timeout 240 $D/kernels.test -test.v -test.count=1 -test.run 'TestKernelMoECombineNorm|TestKernelSmallFast$' > $R/kernels.log 2>&1; echo "rc=$?" >> $R/kernels.log)
grep -E "^--- |moe_combine|mismatched values = [1-9]" $R/kernels.log | grep -v "= 0 (bound" | head -60 >> $R/summary.txt; save
(cd engine/gpu && timeout 300 $D/engine.test -test.v -test.count=1 -test.run 'TestGPUMoENormFusedEqual|TestGPUGreedyMatchesCPUMoENorm|TestGPUGreedyMatchesCPU$|TestGPUGolden$' > $R/engine.log 2>&1; echo "rc=$?" >> $R/engine.log)
grep -E "^(--- |ok|FAIL)|launches off/on" $R/engine.log >> $R/summary.txt; save
bn deepseek-v3.2 8192 1,4 ds-off TILERT_GPU_MOE_NORM_FUSED=0
bn deepseek-v3.2 8192 1,4 ds-on
bn glm-5 8192 1,4 glm-off TILERT_GPU_MOE_NORM_FUSED=0
bn glm-5 8192 1,4 glm-on
PROF=1 bn deepseek-v3.2 8192 1 ds-prof-on
PROF=1 bn deepseek-v3.2 8192 1 ds-prof-off TILERT_GPU_MOE_NORM_FUSED=0
