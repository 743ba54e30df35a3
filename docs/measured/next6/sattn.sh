# Fragment of helper sattn (branch sattn), issues 10 / 11 (TP-8 shard <= 30 us a layer): two latency-bound
# attention kernels in a module of their own (cu/few/, kernels_few.go; the default module is unchanged: PTX diff
# main..sattn: 227 kernels identical):
#  - TILERT_GPU_MLA_FEW=1: the fp8 sparse MLA decode of <= 32 heads (the shard's 16 / 8) on mla_decode_few
#    (8 heads x 16 tokens a block: 16 heads x 2048 tokens = 256 blocks instead of tcf2's 64) + mla_combine_few;
#  - TILERT_GPU_TOPK_FAST=1: the indexer's top-k of rows <= 32768 keys on topk_fast (topk_radix_one's selection,
#    element for element, on 512 threads with warp-0 block scans); =2 also runs the scores and the selection of
#    rows <= 16384 keys as one launch (indexer_scores_topk: indexer_mma.cu's scores body unchanged, the row's
#    last block selects), topk_fast for longer rows.
# Needs $D (kernels.test, engine.test, tilert built from the branch) and $R (results dir); run from the repo root.
# Whole fragment <= 90 s: each step's timeout is the smaller of its own cap and what is left of 90 s. The few
# module (common.cuh + indexer_mma.cu + cu/few) compiles once in step 1 (~10 s here with NVRTC 11.8 under load,
# ~26 s with 12.9 on this 2-core box) into the cache the later steps share.
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
#    after indexer_scores_mma's fused histogram); indexer_scores_topk: scores == indexer_scores_mma bit for bit,
#    selection == CPU == topk_radix_one, plain and per-row cache bases, T 2304..16384, run twice on one scratch.
#    (The module's compile / no-spill check, TestNVRTCCompilesFewModule, runs in CI: it would compile twice more.)
(cd cuda/kernels && TILERT_GPU_REPORT=$R/sattn/kernels-report.txt timeout $(sa_left 30) $D/kernels.test -test.count=1 -test.v \
  -test.run 'TestKernelMLAFew$|TestKernelTopKFast$|TestKernelIndexerScoresTopK$|TestMLAFewSplits$' \
  > $R/sattn/kernels.log 2>&1; echo rc=$? >> $R/sattn/kernels.log)
sa_ok=1; grep -q '^rc=0$' $R/sattn/kernels.log || sa_ok=0
# 2. timing (graph-timed, beside a 256 MiB d2d copy): MLA 2048 of 131072 tokens (cache beyond the L2), 1 row of
#    16 / 8 / 32 heads and 4 rows of 16: tcf2 (default) vs few, each with its combine; the engine's indexer pair
#    (indexer_scores_mma + fused histogram, then the selection) with topk_radix_one vs topk_fast vs the one-launch
#    indexer_scores_topk at 8192 / 16384 / 32768 keys, 1 and 4 rows, the scores alone (the selection's share in
#    the comment column), and topk_fast16 stopped after each stage at 8192 (where the chain's time goes).
(cd cuda/kernels && TILERT_GPU_TIMING=1 TILERT_GPU_REPORT=$R/sattn/timing-report.txt timeout $(sa_left 15) \
  $D/kernels.test -test.count=1 -test.v -test.run 'TestKernelTimingFew$' > $R/sattn/timing.log 2>&1; echo rc=$? >> $R/sattn/timing.log)
# 3. the TP-8 shard layer (TestGPUShardLayerTiming, TILERT_GPU_TIMING=1, ~7 s: DeepSeek-V3.2 and GLM-5 real dims,
#    rank 0 with the indexer and ranks 1-7, context 8192; prints each layer's graphed us and its 10 costliest ops:
#    look for mlaDecode 1x16x2048 / 1x8x2048, topK and indexerScoresQ, or indexerScoresTopK with =2) with
#    TILERT_GPU_MLA_FEW=1 TILERT_GPU_TOPK_FAST=2 (unset and =1: step 6, if time is left).
[ $sa_ok = 1 ] && (cd engine/gpu && TILERT_GPU_TIMING=1 TILERT_GPU_MLA_FEW=1 TILERT_GPU_TOPK_FAST=2 timeout $(sa_left 12) \
  $D/engine.test -test.count=1 -test.v -test.run 'TestGPUShardLayerTiming$' > $R/sattn/shard-fast2.log 2>&1
  echo rc=$? >> $R/sattn/shard-fast2.log)
# 4. engine checks: TestGPUFewKernels (switches set in-process, MLA_FEW=1 with TOPK_FAST=1 then =2: greedy == CPU
#    with and without MTP, batched (merged slots), and the TP shard's greedy; fails unless mla_decode_few and
#    topk_fast / indexer_scores_topk ran: "ran N launches" lines), then the HF goldens with the environment set.
[ $sa_ok = 1 ] && (cd engine/gpu && TILERT_GPU_MLA_FEW=1 TILERT_GPU_TOPK_FAST=2 TILERT_ENGINE_REPORT=$R/sattn/engine-report.txt \
  timeout $(sa_left 22) $D/engine.test -test.count=1 -test.v -test.run 'TestGPUFewKernels$|TestGPUGolden$' > $R/sattn/engine.log 2>&1
  echo rc=$? >> $R/sattn/engine.log)
# 5. the step, 1 slot at 8192, DeepSeek-V3.2 dims, 9 MoE layers: unset vs both switches =1 (the unsharded engine
#    has 128 heads, so only the top-k changes there; mla_decode_few is the shard's: step 3), then TOPK_FAST=2.
sa_bench() {
  case $1 in
  unset) sa_env="env -u TILERT_GPU_MLA_FEW -u TILERT_GPU_TOPK_FAST" ;;
  fast1) sa_env="env TILERT_GPU_MLA_FEW=1 TILERT_GPU_TOPK_FAST=1" ;;
  fast2) sa_env="env TILERT_GPU_MLA_FEW=1 TILERT_GPU_TOPK_FAST=2" ;;
  esac
  $sa_env timeout $(sa_left 15) $D/tilert bench decode --device cuda --dummy-weights deepseek-v3.2 --layers 9 \
    --context 8192 --batches 1 --json $R/sattn/bench-$1.json > $R/sattn/bench-$1.txt 2>&1
  echo rc=$? >> $R/sattn/bench-$1.txt
}
sa_bench unset
[ $sa_ok = 1 ] && sa_bench fast1
[ $sa_ok = 1 ] && [ $(sa_left 90) -gt 12 ] && sa_bench fast2
# 6. the shard layer unset, then with TOPK_FAST=1, if time is left (earlier runs' logs have the unset numbers too).
[ $(sa_left 90) -gt 8 ] && (cd engine/gpu && env -u TILERT_GPU_MLA_FEW -u TILERT_GPU_TOPK_FAST TILERT_GPU_TIMING=1 \
  timeout $(sa_left 12) $D/engine.test -test.count=1 -test.v -test.run 'TestGPUShardLayerTiming$' > $R/sattn/shard-unset.log 2>&1
  echo rc=$? >> $R/sattn/shard-unset.log)
[ $sa_ok = 1 ] && [ $(sa_left 90) -gt 8 ] && (cd engine/gpu && TILERT_GPU_TIMING=1 TILERT_GPU_MLA_FEW=1 TILERT_GPU_TOPK_FAST=1 \
  timeout $(sa_left 12) $D/engine.test -test.count=1 -test.v -test.run 'TestGPUShardLayerTiming$' > $R/sattn/shard-fast1.log 2>&1
  echo rc=$? >> $R/sattn/shard-fast1.log)
true
