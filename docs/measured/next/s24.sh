# Session 23's plan for the next device session (issue 10; NOT RUN). Binaries of main in .device/next, xz'd or not
# (the build line in docs/measured/next/README.md). The working tree plus all five binaries is over the 64 MiB carry
# limit: carry kernels.test, engine.test and tilert for `check` first, then decode.test, cuda.test, cupti.test (and
# tilert) in a second, warm call that runs `check` again (the absent binaries' parts fail fast with rc=127).
# Ask `status` first.
# Usage: bash docs/measured/next/s24.sh check|sh|final
#  check (~7 min): make gpu-check's correctness parts (kernel checks; the engine's ^TestGPU; the decode node's
#        handoff; cuda; cupti), for whatever changed since session 23's calls B-C (all PASS there).
#  sh (~4 min): session 23 call D's one open question, the shared expert's side GEMVs uncapped
#        (TILERT_GPU_SIDE_CAP=sh=0: -5 / -6 us a step there, inside the spread), A/B/A/B at 8192, 1 slot on both
#        models and A/B at 4 slots; change sideCapFor's default only if both models gain in both pairs.
#  final (~5 min): the README's rows, GLM-5's q_a fork A/B/A, traced steps (as session 23 call C).
NAME=s24; . docs/measured/next/plan.sh "$1"
case "$P" in
check)
  export TILERT_GPU_REPORT=$R/report.txt TILERT_ENGINE_REPORT=$R/engine-report.txt
  (cd cuda && timeout 120 $D/cuda.test -test.v -test.count=1 -test.timeout=2m > $R/cuda.log 2>&1; echo "rc=$?" >> $R/cuda.log)
  (cd cuda/kernels && timeout 480 $D/kernels.test -test.v -test.count=1 -test.timeout=9m > $R/kernels.log 2>&1; echo "rc=$?" >> $R/kernels.log) &
  (cd engine/gpu && timeout 480 $D/engine.test -test.v -test.count=1 -test.timeout=9m -test.run '^TestGPU' > $R/engine.log 2>&1; echo "rc=$?" >> $R/engine.log) &
  wait
  (cd roles/decode && timeout 90 $D/decode.test -test.v -test.count=1 -test.timeout=2m -test.run 'TestHandoff(EqualsLocalGeneration|MTPLen)/cuda' > $R/decode.log 2>&1; echo "rc=$?" >> $R/decode.log)
  (cd cuda/cupti && timeout 60 $D/cupti.test -test.v -test.count=1 -test.timeout=1m > $R/cupti.log 2>&1; echo "rc=$?" >> $R/cupti.log)
  for f in cuda kernels engine decode cupti; do cnt $f; done
  save ;;
final)
  JS=1 bn deepseek-v3.2 8192,131072 1,4 ds
  JS=1 bn glm-5 8192,131072 1,4 glm
  MTP=1 bn deepseek-v3.2 8192 1 ds-mtp
  bn glm-5 8192 1 glm-A
  bn glm-5 8192 1 glm-qa TILERT_GPU_SIDE_Q_AT=qa
  bn glm-5 8192 1 glm-qa-cap2 TILERT_GPU_SIDE_Q_AT=qa TILERT_GPU_SIDE_CAP=q=2
  bn glm-5 8192 1 glm-A2
  TL=1 bn deepseek-v3.2 8192 1 tl-ds
  TL=1 bn glm-5 8192 1 tl-glm
  xz -T4 $R/tl-*.json 2>/dev/null; save ;;
sh)
  for m in deepseek-v3.2 glm-5; do
    bn $m 8192 1 $m-A
    bn $m 8192 1 $m-sh0 TILERT_GPU_SIDE_CAP=sh=0
    bn $m 8192 1 $m-A2
    bn $m 8192 1 $m-sh0b TILERT_GPU_SIDE_CAP=sh=0
  done
  bn deepseek-v3.2 8192 4 ds4-A
  bn deepseek-v3.2 8192 4 ds4-sh0 TILERT_GPU_SIDE_CAP=sh=0 ;;
*) echo "usage: s24.sh check|sh|final" >&2; exit 2 ;;
esac
