# Session 42's device plan (issue 10). Usage: bash docs/measured/next/s42.sh v0|v1|v1s|v2|env   (binaries in .device/next)
# Calls A-D (s41.sh qn, wgh2, fork and an inline combination) moved three defaults: TILERT_GPU_QA_NORM=late, the q
# chain forked at q_a everywhere (TILERT_GPU_SIDE_Q_AT auto), the short indexer scores on indexer_scores_wgh2
# (TILERT_GPU_IDX_WGH unset = 2). These parts check and time the code that makes them the defaults:
#  v1 (~8 min): A/B/A/B of the new defaults against the old ones set by switches (DeepSeek-V3.2 dims: QA_NORM=launch SIDE_Q_AT=scores IDX_WGH=long, the
#    scores fork being the old auto one-row rule there; GLM-5 dims: QA_NORM=launch IDX_WGH=long) at 8192 and 131072, then gpu-check's first half (kernels,
#    engine ^TestGPU) on the new defaults.
#  v2 (~5 min; decode.test travels in .device/c3): gpu-check's second half (decode handoff, cuda, cupti), the 4-slot
#    A/B/A/B at 8192 (old: QA_NORM and SIDE_Q_AT change nothing with 4 rows, so IDX_WGH=long alone) and the README's rows.
#  v1s / v0: v1 cut down for a thin budget (session 42 ran out of device time before any of these ran).
#  env (~3 min): switches only, on the new defaults: the launch priority and the q chain's cap on GLM-5 dims at 8192
#    (its wq_b and q_b now start together), MAIN_PRIO=0 on DeepSeek-V3.2 dims, IDX_WGH=long once more.
NAME=s42
if [ "$1" = v2 ] && [ -d .device/c3 ]; then mv .device/c3/* .device/next/; fi
. docs/measured/next/plan.sh "$1"
OLD_DS="TILERT_GPU_QA_NORM=launch TILERT_GPU_SIDE_Q_AT=scores TILERT_GPU_IDX_WGH=long"
OLD_GLM="TILERT_GPU_QA_NORM=launch TILERT_GPU_IDX_WGH=long"
# old: the new defaults against the old ones, GLM-5 at 8192 first (the row the thin parts most want).
old() {
  abab glm-5 8192 1 og $OLD_GLM
  abab deepseek-v3.2 131072 1 od131 $OLD_DS
  abab deepseek-v3.2 8192 1 od $OLD_DS
  abab glm-5 131072 1 og131 $OLD_GLM
}
case "$PART" in
v1)
  old; check1 ;;
v1s)
  # v1 on a thin budget: the kernels' code did not change since calls A-B checked it; the engine's checks first,
  # then as many A/B/A/B rows as the call's time leaves (bn saves after each row).
  tst engine engine/gpu 300 '^TestGPU'; cnt engine; save
  old ;;
v0)
  # thinner still (~3 min of device time left): the engine's GPU checks that the three defaults touch (greedy == CPU,
  # both forms of each switch, the goldens, logits against the emulator, graphs, the pipeline, the side streams, the
  # grouped projections), then one A/B/A/B if time is left.
  tst engine engine/gpu 150 '^TestGPU(QANormLate|IdxWGH|GreedyMatchesCPU|SideStreamSameTokens|GoldenExact|Golden|LogitsMatchEmulator|GraphsEqualEager|PipelineMatches|GroupedProjectionsEqualSeparate|GemvMidProjections|AbsorbFast|ForcedDrafts)$'; cnt engine; save
  abab glm-5 8192 1 og $OLD_GLM ;;
env)
  # env switches only, on the new defaults: the priority and the q chain's cap were last measured before q_a's norm
  # left the chains (GLM-5's wq_b and q_b now start together right after the group and share the bandwidth; the
  # indexer chain is GLM-5's critical one at 8192), and the wgh2 default once more.
  abab glm-5 8192 1 ep1 TILERT_GPU_MAIN_PRIO=1
  abab glm-5 8192 1 ecq TILERT_GPU_SIDE_CAP=q=2
  abab glm-5 8192 1 ewl TILERT_GPU_IDX_WGH=long
  abab deepseek-v3.2 8192 1 ep0 TILERT_GPU_MAIN_PRIO=0
  abab deepseek-v3.2 8192 1 ewd TILERT_GPU_IDX_WGH=long
  abab deepseek-v3.2 131072 1 ep0l TILERT_GPU_MAIN_PRIO=0 ;;
v2)
  check2
  abab deepseek-v3.2 8192 4 od4 TILERT_GPU_IDX_WGH=long
  abab glm-5 8192 4 og4 TILERT_GPU_IDX_WGH=long
  rows ;;
*) echo "usage: s42.sh v0|v1|v1s|v2|env" >&2; exit 2 ;;
esac
