# Session 38's H200 call (issue 10): the README's rows on today's defaults (topk_radix_one_w12, 32-head MLA blocks for
# one row of 64 heads), sampled rows beside them, the old defaults against the new on GLM-5, and the MTP step's
# pipelining (TILERT_GPU_PIPELINE=2, built in session 13 and never run on a device): its checks, then A/B/A/B.
# Usage: bash docs/measured/next/s38.sh final|one   (binaries of main in .device/next; LAYERS=3 on an H100)
# one: TILERT_GPU_SAMPLE_ONE=1, the sampled pick as one cooperative launch (built after the session's device time). Ran in
# session 39 (docs/measured/h100-2026-12-05-s39 call B): slower, removed; the switch is refused, so `one` fails now.
NAME=s38; . docs/measured/next/plan.sh "$1"
case "$PART" in
final)
  # The kernels whose defaults changed or whose sources the session-38 removals touched (gemv_tile.cu, indexer_mma.cu,
  # norm.cu, mla_prefill_wg2.cu), beside the engine's checks with the MTP pipelining on and the 32-head blocks.
  tst kernels cuda/kernels 200 'TestKernelMLADecodeWG2H$|TestKernelMLADecodeWG2$|TestKernelTopKOneW$|TestKernelGemvTile$|TestKernelTileVariantsBitwise$|TestKernelIndexer$|TestKernelSmallFast$|TestKernelNormRopeElementwise$|TestKernelMoECombineNorm$' &
  (export TILERT_GPU_PIPELINE=2; tst engine engine/gpu 200 'TestGPUPipelineMatches$|TestGPUSampledMTPIdentical$|TestGPUGreedyMatchesCPU$|TestGPUMLADecodeWGHeads$') &
  wait; cnt kernels; cnt engine; save
  rows
  SAMP="--temperature 0.6 --top-p 0.95" bn deepseek-v3.2 8192,131072 1 ds-samp
  SAMP="--temperature 0.6 --top-p 0.95" bn glm-5 8192,131072 1 glm-samp
  abab glm-5 8192 1 newg TILERT_GPU_TOPK_W12=0 TILERT_GPU_MLA_HEADS=64
  save ;;
one)
  # TILERT_GPU_SAMPLE_ONE=1 (kernels.SampleWideOne, sample_wide_one; built after session 38's device time, NOT RUN):
  # the sampled pick as one cooperative launch. Its checks and the default's (whose kernels now share its device
  # functions), the picks timed, the engine's sampled tokens with it, then the sampled step A/B/A/B on both models.
  # If it wins twice on a model and loses on neither, make it the default (cuda/kernels ops.go SampleWideOne).
  tst kernels cuda/kernels 200 'TestKernelSampleWideOne$|TestKernelSampling$'; cnt kernels; mv $R/kernels.log $R/kernels-one.log
  (export TILERT_GPU_TIMING=1; tst kernels cuda/kernels 90 'TestKernelTimingSample$'); cnt kernels
  tst engine engine/gpu 200 'TestGPUSampleWideOne$|TestGPUSampleCounterOnDevice$|TestGPUGraphsEqualEager$'; cnt engine
  SAMP="--temperature 0.6 --top-p 0.95" abab deepseek-v3.2 8192 1 one TILERT_GPU_SAMPLE_ONE=1
  SAMP="--temperature 0.6 --top-p 0.95" abab glm-5 8192 1 oneg TILERT_GPU_SAMPLE_ONE=1
  SAMP="--temperature 0.7 --top-k 50 --top-p 0.9" abab deepseek-v3.2 8192 4 one4 TILERT_GPU_SAMPLE_ONE=1
  save ;;
*) echo "usage: s38.sh final|one" >&2; exit 2 ;;
esac
