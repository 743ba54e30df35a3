# Session 28's plan for the next device session (issue 10; NOT RUN). Binaries of main in .device/next, xz'd or not
# (the build line in docs/measured/next/README.md; all six fit one call's carry with the tree). Ask `status` first;
# issue each call right after the last (a machine stays warm ~30 s).
# Usage: bash docs/measured/next/s29.sh lead|lead2|check1|check2|gpucheck|final
#  lead (~6 min; engine.test, cuda.test, tilert): TILERT_GPU_MAIN_PRIO=auto, built in session 28 after its device time
#      (engine/gpu/prio.go prioFor): where q_b is a _d16 launch (DeepSeek-V3.2 dims) the step's stream and the shared
#      expert's side stream at the greatest priority, the q chain's at the least and uncapped at q_a. Session 28 call D
#      measured that configuration by environment (=q with TILERT_GPU_SIDE_CAP=q=0): 2.632 / 2.633 ms against 2.658 /
#      2.663 at 8192, 1 slot. First the GPU checks (TestGPUSideStreamSameTokens runs auto: the same tokens, the runner
#      holding what prioFor says; TestStreamPriority), then A/B/A/B at 1 slot on DeepSeek-V3.2 dims (8192 and 131072,
#      where the late q_b keeps its cap of 2 and the priority alone cost +7..+9 us in call C; a third arm forks at q_a
#      at 131072 too), one GLM-5 row (auto must change nothing there: the runner logs main_raised=false), and the
#      4-slot rows (several rows keep the q chain's cap; the uncapped arm by TILERT_GPU_SIDE_CAP=q=0).
#  lead2 (~3 min; tilert): a third round of the 1-slot A/B and a traced step with auto at 8192.
#  Each bench row now loads faster (--dummy-weights' experts copied on the device, session 28; its rows spent ~22 s
#      loading, load_seconds in the JSON): if a part ends early, add rounds.
#  check1 / check2 / gpucheck / final: as plan.sh (with MAIN_PRIO=auto exported first if auto became the default's
#      candidate: `MAIN_PRIO=auto bash s29.sh gpucheck`).
NAME=s29; . docs/measured/next/plan.sh "$1"
[ -n "$MAIN_PRIO" ] && export TILERT_GPU_MAIN_PRIO=$MAIN_PRIO
case "$P" in
lead)
  tst cuda cuda 60 'TestStreamPriority$'; cnt cuda
  tst engine engine/gpu 240 'TestGPUSideStreamSameTokens$'; cnt engine
  # A, auto, auto forked at q_a at 131072 too, twice. Why the third arm: session 28 call A (TILERT_GPU_MAIN_PRIO=1, the
  # shared expert starved) had DeepSeek-V3.2 at 131072 2.797 uncapped late against 2.774 uncapped at q_a; with the q
  # chain the only low stream, the late fork's reason (q_b starving the scores and the top-k) may be gone.
  for r in 1 2; do
    bn deepseek-v3.2 8192,131072 1 ds-A$r
    bn deepseek-v3.2 8192,131072 1 ds-auto$r TILERT_GPU_MAIN_PRIO=auto
    bn deepseek-v3.2 131072 1 ds-autoqa$r TILERT_GPU_MAIN_PRIO=auto TILERT_GPU_SIDE_Q_AT=qa
  done
  bn glm-5 8192 1 glm-auto TILERT_GPU_MAIN_PRIO=auto; grep -h "main_raised" $R/glm-auto.txt >> $R/summary.txt
  bn deepseek-v3.2 8192,131072 4 ds4-A
  bn deepseek-v3.2 8192,131072 4 ds4-auto TILERT_GPU_MAIN_PRIO=auto
  bn deepseek-v3.2 8192,131072 4 ds4-auto0 TILERT_GPU_MAIN_PRIO=auto TILERT_GPU_SIDE_CAP=q=0 ;;
lead2)
  abab deepseek-v3.2 8192,131072 1 ds-auto3 TILERT_GPU_MAIN_PRIO=auto
  TL=1 bn deepseek-v3.2 8192 1 tl-ds-auto TILERT_GPU_MAIN_PRIO=auto
  xz -T4 $R/tl-*.json 2>/dev/null; save ;;
prio2)
  # Session 29, after call A: auto won at 8192, 1 slot (2.626 / 2.624 against 2.649 / 2.648) and lost at 131072 (+8 us)
  # and at 4 slots (+34 / +70 us), so the priority became a launch attribute decided per step (engine/gpu prio.go:
  # raised only in one-row steps whose q chain forks at q_a) and auto the default. Its checks, then the default
  # against TILERT_GPU_MAIN_PRIO=0 three times at 1 slot, once at 4 slots (must be even now), GLM-5 (launch_prio=off),
  # then check1 on this code.
  tst kernels cuda/kernels 120 'TestLaunchPriority$'; cnt kernels
  tst engine engine/gpu 300 'TestGPUPriorityScoped$|TestGPUSideStreamSameTokens$'; cnt engine
  for r in 1 2 3; do
    bn deepseek-v3.2 8192,131072 1 ds-def$r
    bn deepseek-v3.2 8192,131072 1 ds-off$r TILERT_GPU_MAIN_PRIO=0
  done
  bn deepseek-v3.2 8192,131072 4 ds4-def
  bn deepseek-v3.2 8192,131072 4 ds4-off TILERT_GPU_MAIN_PRIO=0
  bn glm-5 8192 1 glm-def; grep -h "launch_prio" $R/glm-def.txt $R/ds-def1.txt >> $R/summary.txt
  check1 ;;
fin)
  # Call C: check2 on the code of call B, the README's rows on the new default, then the one-row rule's edge: MTP's
  # verify steps have two rows, so auto leaves them at the stream's priority; =q raises them (every step).
  check2; rows
  MTP=1 abab deepseek-v3.2 8192 1 mtp TILERT_GPU_MAIN_PRIO=q; save ;;
check1) check1 ;;
check2) check2 ;;
gpucheck) gpucheck ;;
final) rows ;;
*) echo "usage: s29.sh lead|lead2|prio2|fin|check1|check2|gpucheck|final" >&2; exit 2 ;;
esac
