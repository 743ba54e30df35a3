# Session 38's H200 call (issue 10): the README's rows on today's defaults (topk_radix_one_w12, 32-head MLA blocks for
# one row of 64 heads), sampled rows beside them, the old defaults against the new on GLM-5, and the MTP step's
# pipelining (TILERT_GPU_PIPELINE=2, built in session 13 and never run on a device): its checks, then A/B/A/B.
# Usage: bash docs/measured/next/s38.sh final   (binaries of main in .device/next; LAYERS=3 on an H100)
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
  MTP=1 abab deepseek-v3.2 8192 1 mtp2 TILERT_GPU_PIPELINE=2
  save ;;
*) echo "usage: s38.sh final" >&2; exit 2 ;;
esac
