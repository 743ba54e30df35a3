# Session 41's device plan (issue 10). Usage: bash docs/measured/next/s41.sh wgh2|check2|fork|qn|rows   (binaries in .device/next)
#  wgh2 (~3 min): session 40's TILERT_GPU_IDX_WGH=2 (kernels.IndexerScoresWGH2, built after session 40's device time):
#    runs s40.sh wgh2 (its kernel check, the scores graph-timed _pf / wgh / wgh2, the engine's greedy cases with =2,
#    A/B/A/B at 8192 on both models).
#  check2 (~3 min): gpu-check's second half (plan.sh check2: the decode node's handoff on cuda, cuda, cupti); the
#    binaries that did not travel fail fast (rc=127) and are run in a later call.
#  fork (~6 min): the q chain's fork point again, now that indexer_scores_wgh (session 40) scores the long rows faster
#    (1 x 131072 9.58 against _pf's 11.33 us alone). The rules (engine/gpu side.go qFork) were measured on _pf:
#    DeepSeek-V3.2 dims at 131072 fork before the scores with q_b capped at two blocks an SM (the late chain),
#    GLM-5 dims fork at q_a (q_b `_o4`, open). A/B/A/B, 1 slot: DeepSeek-V3.2 at 131072 against
#    TILERT_GPU_SIDE_Q_AT=qa, against TILERT_GPU_SIDE_CAP=q=1 and against =topk (forked after the scores); GLM-5 at
#    131072 against =scores; GLM-5 at 8192 against =scores-all (session 27 call B: -4 / -18 us on _pf, not kept as
#    inside the spread). No new code: a rule changes only where a variant wins twice and loses nowhere else.
#  qn (~7 min, NOT RUN: built in session 41 without a device): TILERT_GPU_QA_NORM=late (engine/gpu qa_norm.go: q_a's
#    RMSNorm launch off both attention chains; the layer-input group writes q_a times the norm weight and its blocks'
#    sums of squares, absorb_q and the attention epilogue's query part apply the scale): TestKernelQANormLate (the three
#    kernels against the default ones and float64, bad calls refused), TestGPUQANormLate (greedy == CPU, both presets,
#    MTP on and off), then A/B/A/B on both models at 8192 and 131072, 1 slot, and a traced GLM-5 step at 8192 with it.
#    Make it the default where it wins twice on a model and loses nowhere (expected ~-15..-20 us a step).
#  rows (~6 min): the README's rows (plan.sh rows).
# wgh2 is s40.sh's part as it was queued (its results: $OUT/s40-wgh2.tgz, summary-wgh2.txt).
if [ "$1" = wgh2 ]; then exec bash docs/measured/next/s40.sh wgh2; fi
NAME=s41; . docs/measured/next/plan.sh "$1"
case "$PART" in
check2) check2 ;;
qn)
  tst kernels cuda/kernels 300 '^(TestKernelQANormLate|TestKernelFusedAttnEpilogue|TestKernelAbsorbFast)$'; cnt kernels
  tst engine engine/gpu 300 '^TestGPUQANormLate$'; cnt engine
  abab glm-5 8192 1 qng TILERT_GPU_QA_NORM=late
  abab deepseek-v3.2 8192 1 qnd TILERT_GPU_QA_NORM=late
  abab glm-5 131072 1 qng131 TILERT_GPU_QA_NORM=late
  abab deepseek-v3.2 131072 1 qnd131 TILERT_GPU_QA_NORM=late
  TL=1 bn glm-5 8192 1 tl-qn TILERT_GPU_QA_NORM=late
  xz -T4 $R/tl-*.json 2>/dev/null; save ;;
fork)
  abab deepseek-v3.2 131072 1 fqa TILERT_GPU_SIDE_Q_AT=qa
  abab deepseek-v3.2 131072 1 fcap TILERT_GPU_SIDE_CAP=q=1
  abab deepseek-v3.2 131072 1 ftk TILERT_GPU_SIDE_Q_AT=topk
  abab glm-5 131072 1 fsc TILERT_GPU_SIDE_Q_AT=scores
  abab glm-5 8192 1 fsa TILERT_GPU_SIDE_Q_AT=scores-all
  save ;;
rows) rows ;;
*) echo "usage: s41.sh wgh2|check2|fork|qn|rows" >&2; exit 2 ;;
esac
