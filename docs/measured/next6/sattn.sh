# Fragment of helper sattn (branch sattn), issues 10 / 11 (TP-8 shard <= 30 us a layer): two latency-bound
# attention kernels in a new module of their own (cu/few/, kernels_few.go; the default module is unchanged):
#  - TILERT_GPU_MLA_FEW=1: the fp8 sparse MLA decode of <= 32 heads (the shard's 16 / 8) on mla_decode_few
#    (8 heads x 16 tokens a block: 16 heads x 2048 tokens = 256 blocks instead of tcf2's 64) + mla_combine_few;
#  - TILERT_GPU_TOPK_FAST=1: the indexer's top-k of rows <= 32768 keys on topk_fast (topk_radix_one's selection,
#    element for element, on 512 threads with warp-0 block scans).
# Needs $D (kernels.test, engine.test, tilert built from the branch) and $R (results dir); run from the repo root.
# Whole fragment <= 90 s: each step's timeout is the smaller of its own cap and what is left of 90 s. The few
# module compiles once (~5 s with NVRTC 11.8 here; one small module) into the cache the later steps share.
export TILERT_KERNEL_CACHE=${TILERT_KERNEL_CACHE:-/tmp/tilert-kernels}
sa_t0=$SECONDS
sa_left() { local l=$((90 - (SECONDS - sa_t0))); [ $l -lt 1 ] && l=1; [ $l -lt $1 ] && echo $l || echo $1; }
rm -rf $R/sattn; mkdir -p $R/sattn
# 1. kernel checks (fresh random inputs; every row must PASS):
#    mla_decode_few vs float64 (paged cache, -1 padding, indices >= len, a row with no valid token: out 0 and
#    lse -Inf, dense rows, H = 1/8/16/20/32; bound 2e-5), vs mla_decode_tcf three parts at 2048 of 8192 tokens
#    (H 16/8/32/24, 1-4 rows; <= 1e-5), repeat bit-identical, per-row cache bases == one launch per row, bad
#    arguments refused; topk_fast vs the CPU reference and vs topk_radix_one element for element (normal, 64-value
#    ties, one 12-bit bin, all equal, rows shorter than K with -1 padding, T 1500..32768, 1-8 rows, scratch reused,
#    after indexer_scores_mma's fused histogram); the module compiles with no spills.
(cd cuda/kernels && TILERT_GPU_REPORT=$R/sattn/kernels-report.txt timeout $(sa_left 20) $D/kernels.test -test.count=1 -test.v \
  -test.run 'TestKernelMLAFew$|TestKernelTopKFast$|TestMLAFewSplits$|TestNVRTCCompilesFewModule$' > $R/sattn/kernels.log 2>&1
  echo rc=$? >> $R/sattn/kernels.log)
sa_ok=1; grep -q '^rc=0$' $R/sattn/kernels.log || sa_ok=0
# 2. timing (graph-timed, beside a 256 MiB d2d copy): MLA 2048 of 131072 tokens (cache beyond the L2), 1 row of
#    16 / 8 / 32 heads and 4 rows of 16: tcf2 (default) vs few, each with its combine; the engine's indexer pair
#    (indexer_scores_mma + fused histogram, then the selection) with topk_radix_one vs topk_fast at 8192 / 16384 /
#    32768 keys, 1 and 4 rows, and the scores alone (the selection's share is in the comment column).
(cd cuda/kernels && TILERT_GPU_TIMING=1 TILERT_GPU_REPORT=$R/sattn/timing-report.txt timeout $(sa_left 15) \
  $D/kernels.test -test.count=1 -test.v -test.run 'TestKernelTimingFew$' > $R/sattn/timing.log 2>&1; echo rc=$? >> $R/sattn/timing.log)
# 3. the TP-8 shard layer (TestGPUShardLayerTiming, TILERT_GPU_TIMING=1: DeepSeek-V3.2 and GLM-5 real dims, rank 0
#    with the indexer and ranks 1-7, context 8192; prints the layer's graphed us and its 10 costliest ops) with both
#    switches (unset: step 7).
[ $sa_ok = 1 ] && (cd engine/gpu && TILERT_GPU_TIMING=1 TILERT_GPU_MLA_FEW=1 TILERT_GPU_TOPK_FAST=1 timeout $(sa_left 12) \
  $D/engine.test -test.count=1 -test.v -test.run 'TestGPUShardLayerTiming$' > $R/sattn/shard-fast.log 2>&1
  echo rc=$? >> $R/sattn/shard-fast.log)
# 4. engine checks with both switches: TestGPUFewKernels (greedy == CPU with and without MTP, batched, and the TP
#    shard's greedy, with the switches set in-process; fails unless mla_decode_few and topk_fast both ran: "ran N
#    launches"), then with the environment set: the HF goldens and the shard's greedy / serving logits.
[ $sa_ok = 1 ] && (cd engine/gpu && TILERT_GPU_MLA_FEW=1 TILERT_GPU_TOPK_FAST=1 TILERT_ENGINE_REPORT=$R/sattn/engine-report.txt \
  timeout $(sa_left 20) $D/engine.test -test.count=1 -test.v \
  -test.run 'TestGPUFewKernels$|TestGPUGolden$|TestGPUShardGreedy$|TestGPUShardServingLogits$' > $R/sattn/engine.log 2>&1
  echo rc=$? >> $R/sattn/engine.log)
# 5-6. the step, 1 slot at 8192, DeepSeek-V3.2 dims, 9 MoE layers, unset vs both switches =1 (the unsharded engine
#    has 128 heads, so only the top-k changes there; mla_decode_few is the shard's: step 3).
sa_bench() {
  if [ $1 = unset ]; then sa_env="env -u TILERT_GPU_MLA_FEW -u TILERT_GPU_TOPK_FAST"; else sa_env="env TILERT_GPU_MLA_FEW=1 TILERT_GPU_TOPK_FAST=1"; fi
  $sa_env timeout $(sa_left 15) $D/tilert bench decode --device cuda --dummy-weights deepseek-v3.2 --layers 9 \
    --context 8192 --batches 1 --json $R/sattn/bench-$1.json > $R/sattn/bench-$1.txt 2>&1
  echo rc=$? >> $R/sattn/bench-$1.txt
}
sa_bench unset
[ $sa_ok = 1 ] && sa_bench fast
# 7. the shard layer unset, if time is left (the same run's baseline; earlier runs' logs have it too).
[ $(sa_left 90) -gt 8 ] && (cd engine/gpu && env -u TILERT_GPU_MLA_FEW -u TILERT_GPU_TOPK_FAST TILERT_GPU_TIMING=1 \
  timeout $(sa_left 12) $D/engine.test -test.count=1 -test.v -test.run 'TestGPUShardLayerTiming$' > $R/sattn/shard-unset.log 2>&1
  echo rc=$? >> $R/sattn/shard-unset.log)
true
