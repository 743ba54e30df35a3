# Plan fragment of helper dnorm (issue 10: a MoE layer's RMSNorms off their own launches, TILERT_GPU_NORM_FUSE).
# NOT RUN. Bash lines run from the repo root; $D holds kernels.test, engine.test, decode.test and tilert built from
# branch dnorm (or a merge holding it), $R is the results dir. Expected ~110 s with the kernel cache
# (TILERT_KERNEL_CACHE) warm for this source, ~155 s when step 1 pays the cold NVRTC 13 compile (~45 s).
# =1: the layer input's norm in the next layer's grouped input launch (residual add in the MoE combine);
# =2: that, and the post-attention norm in the router's launch (residual add in o_proj). Both bit for bit the default.
# Decides: TILERT_GPU_NORM_FUSE=2 (or =1, by the kernel timing's "in" and "post" rows) may become the default if every
# check PASSes and bench-on's rows beat bench-off's in this run.
mkdir -p $R
# 1. kernel checks vs float64 / the launches they replace (bit for bit) on fresh inputs, and the graph-timed pieces:
#    moe_combine_slots_res, gemv_group_sn_* (staged norm prologue), gemv_bf16_wide_norm_* (router + norm, writes h).
(cd cuda/kernels && TILERT_GPU_TIMING=1 TILERT_GPU_REPORT=$R/kernels-report.txt timeout 75 $D/kernels.test -test.count=1 -test.v \
  -test.run 'TestKernelMoECombineSlotsRes$|TestKernelGemvBF16WideNorm$|TestKernelGemvGroup$/rule=3_staged|TestGroupKernelVariants$|TestKernelTimingNormFuse$' \
  > $R/kernels.log 2>&1; echo rc=$? >> $R/kernels.log)
# 2. engine checks with the switch on (=2 runs every path of =1 too): fused == default bit for bit for =1 and =2 (tokens,
#    caches, batched, teacher-forced and MTP logits), greedy == CPU serving with and without MTP, HF goldens,
#    penalties/logprobs, grouped projections (modes 0/""/3/2).
(cd engine/gpu && TILERT_GPU_NORM_FUSE=2 TILERT_ENGINE_REPORT=$R/engine-report.txt timeout 50 $D/engine.test -test.count=1 -test.v \
  -test.run 'TestGPUNormFuseEqualDefault$|TestGPUGreedyMatchesCPU$|TestGPUGolden$|TestGPUPenaltiesMatchCPU$|TestGPUGroupedProjectionsEqualSeparate$' \
  > $R/engine.log 2>&1; echo rc=$? >> $R/engine.log)
# 3. the step without and with the switch (DeepSeek-V3.2 dims, 10 layers, 9 MoE); the per-kernel profile with it on
timeout 45 $D/tilert bench decode --device cuda --dummy-weights deepseek-v3.2 --layers 9 --context 8192,131072 --batches 1,4 \
  --json $R/bench-off.json > $R/bench-off.txt 2>&1
TILERT_GPU_NORM_FUSE=2 timeout 55 $D/tilert bench decode --device cuda --dummy-weights deepseek-v3.2 --layers 9 --context 8192,131072 \
  --batches 1,4 --profile --json $R/bench-on2-profile.json > $R/bench-on2-profile.txt 2>&1
