# Session 25's plan for the next device session (issue 10; NOT RUN). Binaries of main in .device/next, xz'd or not
# (the build line in docs/measured/next/README.md); at most three xz'd binaries a call (the 64 MiB carry limit).
# Ask `status` first.
# Usage: bash docs/measured/next/s26.sh long|ab|fin|last|check1|check2|final
#  long (~7 min; kernels.test + tilert): the two opt-ins built in session 25 after its device time, not yet run.
#      topk_radix_mark_lw (TILERT_GPU_TOPK_LW=1): TestKernelIndexer (its selections against refTopK on every top-k case,
#      ties, narrow rows, lens, 8 rows, scratch reused; fails unless it ran), the pair and the top-k alone graph-timed
#      beside mark_l (TestKernelTimingIdxMLA: rows "list w"). Then the step at 131072, 1 slot, both models: the
#      default, q_b forked right before the scores (TILERT_GPU_SIDE_Q_AT=scores: today the late fork starts q_b when
#      the scores end, and the front ends with absorb_q after it), the same capped at a block an SM, with mark_lw, and
#      mark_lw alone (expected: nothing, the top-k is off today's critical path), the default and the best pair again.
#      Keep a default only where both models gain in a same-run A/B/A/B (then run check1 again).
#  check1 (~5 min; kernels.test, engine.test, tilert): the kernel checks and the engine's ^TestGPU.
#  check2 (~1 min; decode.test, cuda.test, cupti.test): the decode node's handoff on cuda, cuda, cupti.
#  final (~4 min; tilert): the README's rows, MTP and traced steps (plan.sh rows).
NAME=s26; . docs/measured/next/plan.sh "$1"
case "$P" in
long)
  tst kernels cuda/kernels 200 'TestKernelIndexer$'; cnt kernels
  grep -E "list w" $R/kernels.log | grep -v PASS | head -20 >> $R/summary.txt
  (cd cuda/kernels && TILERT_GPU_TIMING=1 timeout 150 $D/kernels.test -test.run 'TestKernelTimingIdxMLA$' -test.v \
      -test.count=1 > $R/timing.log 2>&1)
  grep -E "graph: (scores\+hist, topk after hist|topk_radix) \((list|list w)\)" $R/timing.log >> $R/summary.txt; save
  for m in deepseek-v3.2 glm-5; do
    bn $m 131072 1 $m-A
    bn $m 131072 1 $m-sc TILERT_GPU_SIDE_Q_AT=scores
    bn $m 131072 1 $m-sc1 TILERT_GPU_SIDE_Q_AT=scores TILERT_GPU_SIDE_CAP=q=1
    bn $m 131072 1 $m-sclw TILERT_GPU_SIDE_Q_AT=scores TILERT_GPU_TOPK_LW=1
    bn $m 131072 1 $m-lw TILERT_GPU_TOPK_LW=1
    bn $m 131072 1 $m-A2
    bn $m 131072 1 $m-sclw2 TILERT_GPU_SIDE_Q_AT=scores TILERT_GPU_TOPK_LW=1
  done ;;
ab) # after the long part: mark_lw and the fork before the scores the default (auto); the kernel and engine checks on
    # that code, then the step at 131072, 1 slot, the new default against the old (TILERT_GPU_TOPK_LW=0: mark_l, auto
    # then forks after the scores as before), A/B/A/B.
  check1
  for m in deepseek-v3.2 glm-5; do abab $m 131072 1 $m-lw TILERT_GPU_TOPK_LW=0; done ;;
fin) # the README's rows, and the 4-slot rows at 131072 A/B/A/B as in ab (mark_lw runs there too; the q chain forks
     # at q_a). tilert only; check2 follows in its own call (the carry limit).
  rows
  for m in deepseek-v3.2 glm-5; do abab $m 131072 4 $m-lw4 TILERT_GPU_TOPK_LW=0; done ;;
last) # fin's call was lost with the machine (no results); with the device time left: the decode node's handoff on cuda
      # and the cuda tests (cupti's binary left out for the carry limit: its tests profile, nothing changed there), then
      # the README's rows and MTP.
  tst decode roles/decode 90 'TestHandoff(EqualsLocalGeneration|MTPLen)/cuda'
  tst cuda cuda 120
  for f in decode cuda; do cnt $f; done; save
  JS=1 bn deepseek-v3.2 8192,131072 1,4 ds
  JS=1 bn glm-5 8192,131072 1,4 glm
  MTP=1 bn deepseek-v3.2 8192 1 ds-mtp ;;
check1) check1 ;;
check2) check2 ;;
final) rows ;;
*) echo "usage: s26.sh long|ab|fin|last|check1|check2|final" >&2; exit 2 ;;
esac
