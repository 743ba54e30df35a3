# Session 45's device plan (issue 10). Usage: bash docs/measured/next/s45.sh v2|r1|r0|pr|fk|ac|ah   (binaries in .device/next)
# Session 44 ran gpu-check's first half on an H100 (3 MoE layers) and changed the launch priority's rule for long
# one-row steps; no H200 came, so the README's H200 rows are still session 40's. This session takes them first.
#  v2 (~8 min, an H200: 9 MoE layers do not fit 80 GB): gpu-check's second half (decode.test, cuda.test, cupti.test
#    from .device/c3), then the README's rows (both models, 8192 and 131072, 1 and 4 slots, MTP, a traced step of each).
#  pr (~4 min): session 44's priority rule at 9 layers (=q is the old auto on a one-row step past 32768 keys).
#  fk (~5 min): the late q forks and the shared expert's cap on the now unraised long one-row steps, GLM-5 raised at
#    131072 (session 44's fk, not run).
#  (and s44.sh ab, ~6 min: the wgh2 rule against =2short at 131072, session 41's defaults at 8192, scores timing.)
#  r1 (~1.5 min, an H200): v2's 1-slot rows alone, JSON.
#  r0 (~1 min, an H200): DeepSeek-V3.2 dims at 8192 and GLM-5 dims at 131072, 1 slot, alone.
#  ah (~3 min, an H200): ac's 1-slot rows at 9 MoE layers (DeepSeek-V3.2 dims 8192, GLM-5 131072).
#  ac (~7 min, LAYERS=3 fits an H100; binaries from .device/c4: engine.test, tilert): the pipelined step's copies
#    beside the main stream (ahead.go aheadCopyOn) against TILERT_GPU_AHEAD_COPY=0, after the engine checks it touches.
NAME=s45
. docs/measured/next/plan.sh "$1"
case "$PART" in
v2)
  check2; rows ;;
pr)
  abab deepseek-v3.2 131072 1 pq131 TILERT_GPU_MAIN_PRIO=q
  abab deepseek-v3.2 32768 1 pq32 TILERT_GPU_MAIN_PRIO=q ;;
fk)
  abab deepseek-v3.2 131072 1 fks TILERT_GPU_SIDE_Q_AT=scores
  abab deepseek-v3.2 131072 1 fkt TILERT_GPU_SIDE_Q_AT=topk
  abab glm-5 131072 1 pqg TILERT_GPU_MAIN_PRIO=q
  abab deepseek-v3.2 131072 1 fsh TILERT_GPU_SIDE_CAP=sh=0
  abab glm-5 131072 1 fshg TILERT_GPU_SIDE_CAP=sh=0 ;;
ac)
  tst engine engine/gpu 170 '^TestGPU(PipelineMatches|PipelineDrains|GreedyMatchesCPU|SideStreamSameTokens|GraphsEqualEager)$'; cnt engine; save
  abab deepseek-v3.2 8192 1 ac8 TILERT_GPU_AHEAD_COPY=0
  abab glm-5 8192 1 acg TILERT_GPU_AHEAD_COPY=0
  abab deepseek-v3.2 131072 1 ac131 TILERT_GPU_AHEAD_COPY=0
  abab deepseek-v3.2 8192 4 ac4 TILERT_GPU_AHEAD_COPY=0
  MTP=1 abab deepseek-v3.2 8192 1 acm TILERT_GPU_AHEAD_COPY=0
  # The traced step's ~10 us idle after its first kernel (the embedding): on one stream too?
  TL=1 bn deepseek-v3.2 8192 1 tl-def; TL=1 bn deepseek-v3.2 8192 1 tl-side0 TILERT_GPU_SIDE=0
  grep -h -E "timeline|idle " $R/tl-def.txt $R/tl-side0.txt | head -12 >> $R/summary.txt; xz -T4 $R/tl-*.json; save ;;
r1)
  # v2's 1-slot rows alone (a thin budget: ~2.5 min on an H200 with its start)
  JS=1 bn deepseek-v3.2 8192,131072 1 ds1
  JS=1 bn glm-5 8192,131072 1 glm1 ;;
r0)
  # the headline row and the closest miss (GLM-5 dims at 131072), alone (~1 min on an H200 with its warm-up)
  JS=1 bn deepseek-v3.2 8192 1 ds0
  JS=1 bn glm-5 131072 1 glm0 ;;
ah)
  # ac's two 1-slot rows at 9 MoE layers (an H200), where the targets are held
  abab deepseek-v3.2 8192 1 ah8 TILERT_GPU_AHEAD_COPY=0
  abab glm-5 131072 1 ahg TILERT_GPU_AHEAD_COPY=0 ;;
*) echo "usage: s45.sh v2|r1|r0|pr|fk|ac|ah" >&2; exit 2 ;;
esac
