# Session 40's device plan (issue 10). Usage: bash docs/measured/next/s40.sh embed|...   (binaries in .device/next)
#  embed (~4 min): session 39's TILERT_GPU_EMBED_VEC=1 (kernels.EmbedVec: the embedding row's loads before its stores):
#    its kernel checks, the engine's greedy cases with it on, A/B/A/B on both models at 8192, 1 slot; then a traced
#    step of each model at 131072 (where the indexer's scores and long-row top-k sit on the critical path).
#  wgh (~7 min): TILERT_GPU_IDX_WGH=1 (kernels.IndexerScoresWGH: the indexer scores on wgmma with the keys as M; built in
#    session 40): its kernel check (fresh inputs vs float64, vs _pf, histogram + top-k, rows, bad arguments), the
#    scores graph-timed against _pf (TILERT_GPU_TIMING=1), the engine's greedy cases with it on, then A/B/A/B on both
#    models at 131072 and 8192, 1 slot, and a traced GLM-5 step at 131072 with it. If it wins twice on both at 131072
#    and loses nowhere, make it the default where the sm_90a module loads.
#  final (~8 min): session 40's defaults (the embedding's loads before its stores; indexer_scores_wgh at more than
#    65536 keys a launch, now with two pages in flight): their kernel and engine checks, the scores graph-timed again,
#    A/B/A/B against TILERT_GPU_IDX_WGH=0 at 131072 on both models and against =1 on GLM-5 at 8192 (a page a block
#    now adds to the histogram in global memory directly), then the README's rows (plan.sh rows).
#  wgh2 (~3 min, NOT RUN: built after session 40's device time): TILERT_GPU_IDX_WGH=2 (kernels.IndexerScoresWGH2: the
#    short launches on two-warpgroup blocks sharing the query's staging and the histogram; bits = wgh's): the kernel
#    check, the scores graph-timed (_pf / wgh / wgh2), the engine's greedy cases with =2, A/B/A/B at 8192 on both
#    models (GLM-5's indexer chain is the critical one there). If =2 wins twice on GLM-5 and loses nowhere, take wgh2
#    below 65536 keys by default.
#  check1 (~7 min): gpu-check's first half (plan.sh check1: the kernel checks and the engine's ^TestGPU) on these binaries.
NAME=s40; . docs/measured/next/plan.sh "$1"
case "$PART" in
embed)
  tst kernels cuda/kernels 120 'TestKernelNormRopeElementwise$'; cnt kernels
  tst engine engine/gpu 200 'TestGPUEmbedVec$'; cnt engine
  abab deepseek-v3.2 8192 1 emb TILERT_GPU_EMBED_VEC=1
  abab glm-5 8192 1 embg TILERT_GPU_EMBED_VEC=1
  TL=1 bn glm-5 8192 1 tl-emb TILERT_GPU_EMBED_VEC=1
  TL=1 bn glm-5 131072 1 tl-glm131
  TL=1 bn deepseek-v3.2 131072 1 tl-ds131
  xz -T4 $R/tl-*.json 2>/dev/null; save ;;
wgh)
  tst kernels cuda/kernels 200 'TestKernelIndexerWGH$'; cnt kernels
  TILERT_GPU_TIMING=1 tst kernels cuda/kernels 200 'TestKernelTimingIdxWGH$'; cnt kernels
  grep -E "graph: indexer" $R/kernels.log | tee -a $R/summary.txt
  tst engine engine/gpu 200 'TestGPUIdxWGH$'; cnt engine
  abab glm-5 131072 1 wghg TILERT_GPU_IDX_WGH=1
  abab deepseek-v3.2 131072 1 wghd TILERT_GPU_IDX_WGH=1
  abab glm-5 8192 1 wghg8 TILERT_GPU_IDX_WGH=1
  abab deepseek-v3.2 8192 1 wghd8 TILERT_GPU_IDX_WGH=1
  TL=1 bn glm-5 131072 1 tl-wgh131 TILERT_GPU_IDX_WGH=1
  xz -T4 $R/tl-*.json 2>/dev/null; save ;;
final)
  tst kernels cuda/kernels 300 '^(TestKernelIndexerWGH|TestKernelNormRopeElementwise|TestKernelIndexer|TestKernelSlotRows)$'; cnt kernels
  TILERT_GPU_TIMING=1 tst kernels cuda/kernels 200 'TestKernelTimingIdxWGH$'; cnt kernels
  grep -E "graph: indexer" $R/kernels.log | tee -a $R/summary.txt
  tst engine engine/gpu 300 '^TestGPU(IdxWGH|GreedyMatchesCPU|GraphsEqualEager|PipelineMatches|SlotMergeEqualPerSlot)$'; cnt engine
  abab glm-5 131072 1 wg2g TILERT_GPU_IDX_WGH=0
  abab deepseek-v3.2 131072 1 wg2d TILERT_GPU_IDX_WGH=0
  abab glm-5 8192 1 wg8g TILERT_GPU_IDX_WGH=1
  rows
  save ;;
wgh2)
  tst kernels cuda/kernels 200 'TestKernelIndexerWGH$'; cnt kernels
  TILERT_GPU_TIMING=1 tst kernels cuda/kernels 200 'TestKernelTimingIdxWGH$'; cnt kernels
  grep -E "graph: indexer" $R/kernels.log | tee -a $R/summary.txt
  tst engine engine/gpu 300 'TestGPUIdxWGH$'; cnt engine
  abab glm-5 8192 1 wgh2g TILERT_GPU_IDX_WGH=2
  abab deepseek-v3.2 8192 1 wgh2d TILERT_GPU_IDX_WGH=2
  save ;;
check1) check1 ;;
rows) rows ;;
*) echo "usage: s40.sh embed|wgh|final|wgh2|check1|rows" >&2; exit 2 ;;
esac
