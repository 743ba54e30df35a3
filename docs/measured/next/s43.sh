# Session 43's device plan (issue 10). Usage: bash docs/measured/next/s43.sh a|t|c1   (binaries in .device/next)
# Session 42's three defaults (s42.sh) had not run as defaults; this session puts the one-row long indexer scores on
# indexer_scores_wgh2 too (TILERT_GPU_IDX_WGH unset: launches of fewer than 2^19 keys; =2short is session 42's rule,
# 65536 or fewer). Call A (docs/measured/h100-2026-12-06-s43) ran `t` on 643e8c2, where that rule was the opt-in
# =2long and the rows' variant was 2long against session 42's default.
#  a (~6 min): A/B/A/B of the default at 131072 against 2short on both models, the new defaults against session 41's set by
#    switches (s42.sh's old()), then the engine's GPU checks these defaults touch (s42.sh v0's list) and the scores'
#    graph timing (now with 2 rows).
#  t (~4 min): a cut down for a thin budget.
#  c1 (~7 min): gpu-check's first half (kernels, engine ^TestGPU) on the new defaults. The second half and the README's
#    rows: s42.sh v2.
NAME=s43
. docs/measured/next/plan.sh "$1"
OLD_DS="TILERT_GPU_QA_NORM=launch TILERT_GPU_SIDE_Q_AT=scores TILERT_GPU_IDX_WGH=long"
OLD_GLM="TILERT_GPU_QA_NORM=launch TILERT_GPU_IDX_WGH=long"
# The engine GPU tests the defaults touch (s42.sh v0's list).
ENG='^TestGPU(QANormLate|IdxWGH|GreedyMatchesCPU|SideStreamSameTokens|GoldenExact|Golden|LogitsMatchEmulator|GraphsEqualEager|PipelineMatches|GroupedProjectionsEqualSeparate|GemvMidProjections|AbsorbFast|ForcedDrafts)$'
case "$PART" in
a)
  abab glm-5 131072 1 w2g TILERT_GPU_IDX_WGH=2short
  abab deepseek-v3.2 131072 1 w2d TILERT_GPU_IDX_WGH=2short
  abab glm-5 8192 1 og $OLD_GLM
  abab deepseek-v3.2 8192 1 od $OLD_DS
  abab glm-5 131072 1 og131 $OLD_GLM
  abab deepseek-v3.2 131072 1 od131 $OLD_DS
  tst engine engine/gpu 150 "$ENG"; cnt engine; save
  ln -sf $D/kernels.test $D/ktime.test; export TILERT_GPU_TIMING=1; tst ktime cuda/kernels 90 '^TestKernelTimingIdxWGH$'; grep -E "indexer_scores|copy" $R/ktime.log | tail -30 >> $R/summary.txt; save ;;
t)
  # a on a thin budget: the engine's checks first, then the two A/B/A/B rows this session's change and session 42's
  # defaults most want.
  tst engine engine/gpu 150 "$ENG"; cnt engine; save
  abab glm-5 131072 1 w2g TILERT_GPU_IDX_WGH=2short
  abab glm-5 8192 1 og $OLD_GLM
  abab deepseek-v3.2 131072 1 w2d TILERT_GPU_IDX_WGH=2short ;;
c1)
  check1 ;;
*) echo "usage: s43.sh a|t|c1" >&2; exit 2 ;;
esac
