# Session 27's plan for the next device session (issue 10; NOT RUN). Binaries of main in .device/next, xz'd or not
# (the build line in docs/measured/next/README.md; all six fit one call's carry with the tree). Ask `status` first;
# issue each call right after the last (a machine stays warm ~30 s).
# Usage: bash docs/measured/next/s28.sh prio|prio2|prio4|leads|c|d|check1|check2|gpucheck|final
#  prio (~6 min; cuda.test, engine.test, tilert): TILERT_GPU_MAIN_PRIO=1, built in session 27 after its device time
#      (engine/gpu/prio.go): the step's stream at the greatest priority, the side streams at the default, graphs
#      instantiated with the nodes' priorities (session 11's priority never reached its graphs). First TestStreamPriority
#      (the range, the instantiate flag, a replayed graph) and TestGPUSideStreamSameTokens (its two new configurations:
#      the same tokens with the priority, capped and uncapped), then the step, 1 slot, 8192 and 131072, both models:
#      default, MAIN_PRIO=1, MAIN_PRIO=1 with both side chains uncapped (TILERT_GPU_SIDE_CAP=0), and that with the q
#      chain forked at q_a (prio_ab below); prio2 (~5 min) the second round and two traced steps. Session 27's
#      traces: at 131072 the top-k's blocks wait ~9 us for q_b's queued ones (DeepSeek-V3.2) and the front ends on the
#      top-k (GLM-5); at 8192 DeepSeek-V3.2's capped q_b (28 us for 37.7 MB) is the front's critical chain.
#  prio4 (~5 min; tilert): the same at 4 slots, and traced 1-slot steps with the priority (where the front ends).
#  leads (~4 min; tilert): env-only leads from session 27 at 131072, 1 slot, A/B/A/B: DeepSeek-V3.2 with the q chain
#      capped at two blocks an SM (TILERT_GPU_SIDE_CAP=q=2: 2.775 / 2.777 against 2.783 / 2.785 in session 27), and
#      the q chain forked at q_a uncapped (TILERT_GPU_SIDE_Q_AT=qa TILERT_GPU_SIDE_CAP=q=0) on both models.
#  check1 / check2 / gpucheck / final: as plan.sh (with MAIN_PRIO=1 exported first if it became the default's
#      candidate: `MAIN_PRIO=1 bash s28.sh gpucheck`).
NAME=s28; . docs/measured/next/plan.sh "$1"
[ -n "$MAIN_PRIO" ] && export TILERT_GPU_MAIN_PRIO=$MAIN_PRIO
# prio_ab REP: the step, 1 slot, 8192 and 131072, both models: default, the priority (today's caps), the priority with
# both side chains uncapped, and the priority with the q chain forked at q_a uncapped (with a priority the cap's
# reason, a starved main chain, may be gone, and so the late fork's).
prio_ab() {
  for m in deepseek-v3.2 glm-5; do
    bn $m 8192,131072 1 $m-$1
    bn $m 8192,131072 1 $m-pr$1 TILERT_GPU_MAIN_PRIO=1
    bn $m 8192,131072 1 $m-pr0$1 TILERT_GPU_MAIN_PRIO=1 TILERT_GPU_SIDE_CAP=0
    bn $m 8192,131072 1 $m-prqa$1 TILERT_GPU_MAIN_PRIO=1 TILERT_GPU_SIDE_CAP=0 TILERT_GPU_SIDE_Q_AT=qa
  done
}
case "$P" in
prio)
  tst cuda cuda 60 'TestStreamPriority$'; cnt cuda; grep -E "stream priorities" $R/cuda.log >> $R/summary.txt
  tst engine engine/gpu 200 'TestGPUSideStreamSameTokens$'; cnt engine
  prio_ab A ;;
prio2)
  prio_ab B
  TL=1 bn deepseek-v3.2 8192 1 tl-ds-pr0 TILERT_GPU_MAIN_PRIO=1 TILERT_GPU_SIDE_CAP=0
  TL=1 bn glm-5 131072 1 tl-glm-long-pr TILERT_GPU_MAIN_PRIO=1
  xz -T4 $R/tl-*.json 2>/dev/null; save ;;
prio4)
  for m in deepseek-v3.2 glm-5; do
    bn $m 8192,131072 4 $m-4A
    bn $m 8192,131072 4 $m-pr4 TILERT_GPU_MAIN_PRIO=1
    bn $m 8192,131072 4 $m-pr04 TILERT_GPU_MAIN_PRIO=1 TILERT_GPU_SIDE_CAP=0
  done
  TL=1 bn deepseek-v3.2 8192 1 tl-ds-pr TILERT_GPU_MAIN_PRIO=1
  TL=1 bn glm-5 131072 1 tl-glm-long-pr TILERT_GPU_MAIN_PRIO=1
  xz -T4 $R/tl-*.json 2>/dev/null; save ;;
leads)
  abab deepseek-v3.2 131072 1 ds-q2 TILERT_GPU_SIDE_CAP=q=2
  for m in deepseek-v3.2 glm-5; do
    bn $m 131072 1 $m-qa0 TILERT_GPU_SIDE_Q_AT=qa TILERT_GPU_SIDE_CAP=q=0
  done
  # why the priority lost (call A: +50..+66 us on every row): DeepSeek-V3.2 at 8192 traced with and without it
  TL=1 bn deepseek-v3.2 8192 1 tl-ds-def
  TL=1 bn deepseek-v3.2 8192 1 tl-ds-pr TILERT_GPU_MAIN_PRIO=1
  xz -T4 $R/tl-*.json 2>/dev/null; save ;;
c)
  # after call A (the priority lost everywhere) and B's traces (the shared expert's down starved at the MoE's join):
  # TILERT_GPU_MAIN_PRIO=q (the shared expert's side stream raised with the main); the default now caps a late _d16
  # q_b at 2 an SM (DeepSeek-V3.2 at 131072); GLM-5 forked at q_a (B: 2.802 at 131072 against A's 2.828)
  tst engine engine/gpu 200 'TestGPUSideStreamSameTokens$'; cnt engine
  abab glm-5 8192,131072 1 glm-qa TILERT_GPU_SIDE_Q_AT=qa
  abab deepseek-v3.2 8192,131072 1 ds-pq TILERT_GPU_MAIN_PRIO=q
  abab glm-5 8192,131072 1 glm-pq TILERT_GPU_MAIN_PRIO=q
  bn deepseek-v3.2 8192,131072 1 ds-pq0 TILERT_GPU_MAIN_PRIO=q TILERT_GPU_SIDE_CAP=q=0
  bn glm-5 8192,131072 1 glm-pqqa TILERT_GPU_MAIN_PRIO=q TILERT_GPU_SIDE_Q_AT=qa ;;
d)
  # main with call C's two defaults (GLM-5's q chain at q_a; a late _d16 q_b capped at 2): gpu-check, the README's rows,
  # then a lead for the next session: DeepSeek-V3.2 at 8192 with the priority replacing the q chain's cap
  # (call C, one run: 2.646 against 2.662 / 2.666)
  gpucheck; rows
  abab deepseek-v3.2 8192 1 ds-pq0 TILERT_GPU_MAIN_PRIO=q TILERT_GPU_SIDE_CAP=q=0 ;;
check1) check1 ;;
check2) check2 ;;
gpucheck) gpucheck ;;
final) rows ;;
*) echo "usage: s28.sh prio|prio2|prio4|leads|c|d|check1|check2|gpucheck|final" >&2; exit 2 ;;
esac
