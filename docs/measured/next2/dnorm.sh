# Plan fragment of helper dnorm (issue 10: the layer input's RMSNorm off its own launch, TILERT_GPU_NORM_FUSE=1).
# NOT RUN. Bash lines run from the repo root; $D holds kernels.test, engine.test, decode.test and tilert built from
# branch dnorm (or a merge holding it), $R is the results dir. Expected wall time ~130-150 s with the kernel cache
# (TILERT_KERNEL_CACHE) already warm for this source; a cold NVRTC 13 compile of the module adds ~45 s to step 1.
# What it decides: whether TILERT_GPU_NORM_FUSE=1 may become the default (all checks PASS and the bench rows with it
# are faster than without in the same run).
mkdir -p $R/dnorm
# 1. kernel checks vs CPU/float64 references on fresh inputs and vs the launches they replace (bit for bit):
#    moe_combine_slots_res; gemv_group_sn_* (the staged norm prologue; M=1,2,3,4 at K=7168/6144, K past the
#    staged limit falls back); plus the graph-timed comparison (combine + add_rmsnorm + grouped input launch
#    against the residual combine + the grouped launch with the staged / plain prologue; q_b + wq_b likewise).
(cd cuda/kernels && TILERT_GPU_TIMING=1 TILERT_GPU_REPORT=$R/dnorm/kernels-report.txt timeout 75 $D/kernels.test -test.count=1 -test.v \
  -test.run 'TestKernelMoECombineSlotsRes$|TestKernelGemvGroup$/rule=3_staged|TestGroupKernelVariants$|TestKernelTimingNormFuse$' \
  > $R/dnorm/kernels.log 2>&1; echo rc=$? >> $R/dnorm/kernels.log)
# 2. engine checks with the switch on: fused == default bit for bit (tokens, caches, logits, MTP logits, batched),
#    greedy == CPU serving with and without MTP, HF goldens, penalties/logprobs, grouped projections (modes 0/""/3/2).
(cd engine/gpu && TILERT_GPU_NORM_FUSE=1 TILERT_ENGINE_REPORT=$R/dnorm/engine-report.txt timeout 50 $D/engine.test -test.count=1 -test.v \
  -test.run 'TestGPUNormFuseEqualDefault$|TestGPUGreedyMatchesCPU$|TestGPUGolden$|TestGPUPenaltiesMatchCPU$|TestGPUGroupedProjectionsEqualSeparate$' \
  > $R/dnorm/engine.log 2>&1; echo rc=$? >> $R/dnorm/engine.log)
# 3. the step without and with the switch (DeepSeek-V3.2 dims, 10 layers, 9 MoE), then the per-kernel profile with it on
timeout 45 $D/tilert bench decode --device cuda --dummy-weights deepseek-v3.2 --layers 9 --context 8192,131072 --batches 1,4 \
  --json $R/dnorm/bench-off.json > $R/dnorm/bench-off.txt 2>&1
TILERT_GPU_NORM_FUSE=1 timeout 45 $D/tilert bench decode --device cuda --dummy-weights deepseek-v3.2 --layers 9 --context 8192,131072 \
  --batches 1,4 --json $R/dnorm/bench-on.json > $R/dnorm/bench-on.txt 2>&1
TILERT_GPU_NORM_FUSE=1 timeout 30 $D/tilert bench decode --device cuda --dummy-weights deepseek-v3.2 --layers 9 --context 8192 \
  --batches 1 --profile --json $R/dnorm/bench-on-profile.json > $R/dnorm/bench-on-profile.txt 2>&1
