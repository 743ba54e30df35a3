# Session 44's device plan (issue 10). Usage: bash docs/measured/next/s44.sh c1|v2|ab|pq|pqt|fk|t   (binaries in .device/next)
# Sessions 42-43 changed three defaults (q_a's norm late, the q chain forked at q_a, the indexer scores on
# indexer_scores_wgh2 for launches under 2^19 keys) and session 43 mended two engine tests; none of it has run
# gpu-check whole, and the README's H200 rows are session 40's. So this session checks first, then re-takes the rows.
#  c1 (~7 min): gpu-check's first half (kernels, engine ^TestGPU) on today's defaults.
#  v2 (~8 min): gpu-check's second half (decode.test travels alone from .device/c3: with the rest it is over the 64 MiB carry), then
#    the README's rows (both models, 8192 and 131072, 1 and 4 slots, MTP, a traced step of each).
#  ab (~6 min): the A/B/A/B rows s43.sh a left: today's default at 131072 against =2short on both models, and
#    today's defaults against session 41's set by switches; the scores' graph timing at 1, 2 and 4 rows.
#  pq (~3 min): the launch priority's new rule (prio.go stepRaised: a one-row step past 32768 keys no longer raised,
#    its q chain capped as with the priorities off) against the old one (=q is the old auto on a one-row
#    DeepSeek-V3.2 step), and the engine checks it touches.
#  pqt (~2 min): pq on a thin budget (ran as call G, docs/measured/h100-2026-12-06-s44).
#  fk (~3 min): the late q forks and the shared expert's cap on the now unraised long one-row steps, GLM-5 raised at
#    131072 (not run).
#  t (~3 min): a thin budget's part: the engine tests session 43 mended, and one A/B/A/B row.
NAME=s44
. docs/measured/next/plan.sh "$1"
OLD_DS="TILERT_GPU_QA_NORM=launch TILERT_GPU_SIDE_Q_AT=scores TILERT_GPU_IDX_WGH=long"
OLD_GLM="TILERT_GPU_QA_NORM=launch TILERT_GPU_IDX_WGH=long"
case "$PART" in
c1)
  check1 ;;
v2)
  check2; rows ;;
ab)
  abab glm-5 131072 1 w2g TILERT_GPU_IDX_WGH=2short
  abab deepseek-v3.2 131072 1 w2d TILERT_GPU_IDX_WGH=2short
  abab glm-5 8192 1 og $OLD_GLM
  abab deepseek-v3.2 8192 1 od $OLD_DS
  ln -sf $D/kernels.test $D/ktime.test; export TILERT_GPU_TIMING=1; tst ktime cuda/kernels 90 '^TestKernelTimingIdxWGH$'; grep -E "indexer_scores|copy" $R/ktime.log | tail -30 >> $R/summary.txt; save ;;
pq)
  tst engine engine/gpu 150 '^TestGPU(PriorityScoped|GreedyMatchesCPU|SideStreamSameTokens|GraphsEqualEager|PipelineMatches)$'; cnt engine; save
  abab deepseek-v3.2 131072 1 pq131 TILERT_GPU_MAIN_PRIO=q
  abab deepseek-v3.2 32768 1 pq32 TILERT_GPU_MAIN_PRIO=q
  abab deepseek-v3.2 8192 1 pq8 TILERT_GPU_MAIN_PRIO=q
  abab deepseek-v3.2 131072 2 pq2 TILERT_GPU_MAIN_PRIO=0
  abab deepseek-v3.2 131072 1 pqc2 TILERT_GPU_SIDE_CAP=q=2
  abab glm-5 131072 1 pqg TILERT_GPU_MAIN_PRIO=q ;;
pqt)
  # pq on a thin budget
  tst engine engine/gpu 100 '^TestGPU(PriorityScoped|GreedyMatchesCPU|SideStreamSameTokens)$'; cnt engine; save
  abab deepseek-v3.2 131072 1 pq131 TILERT_GPU_MAIN_PRIO=q
  abab deepseek-v3.2 32768 1 pq32 TILERT_GPU_MAIN_PRIO=q
  abab deepseek-v3.2 8192 1 pq8 TILERT_GPU_MAIN_PRIO=q
  abab deepseek-v3.2 131072 1 pqc2 TILERT_GPU_SIDE_CAP=q=2 ;;
fk)
  # Session 42 chose the q_a fork at 131072 on steps that were raised; unraised now (call G), the late forks again
  # (their q chain at two blocks an SM for a _d16 q_b), and GLM-5's long step raised (=q; never measured at 131072).
  abab deepseek-v3.2 131072 1 fks TILERT_GPU_SIDE_Q_AT=scores
  abab deepseek-v3.2 131072 1 fkt TILERT_GPU_SIDE_Q_AT=topk
  abab glm-5 131072 1 pqg TILERT_GPU_MAIN_PRIO=q
  # the shared expert uncapped on the unraised long steps (it keeps a block an SM there, as with the priorities off)
  abab deepseek-v3.2 131072 1 fsh TILERT_GPU_SIDE_CAP=sh=0
  abab glm-5 131072 1 fshg TILERT_GPU_SIDE_CAP=sh=0 ;;
t)
  tst engine engine/gpu 150 '^TestGPU(AbsorbFast|IdxWGH|GreedyMatchesCPU|QANormLate)$'; cnt engine; save
  abab glm-5 131072 1 w2g TILERT_GPU_IDX_WGH=2short ;;
*) echo "usage: s44.sh c1|v2|ab|pq|pqt|fk|t" >&2; exit 2 ;;
esac
