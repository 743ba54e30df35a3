# Session 25's plan for the next device session (issue 10; NOT RUN). Binaries of main in .device/next, xz'd or not
# (the build line in docs/measured/next/README.md); at most three xz'd binaries a call (the 64 MiB carry limit).
# Ask `status` first.
# Usage: bash docs/measured/next/s26.sh lw|check1|check2|final
#  lw (~5 min; kernels.test + tilert): topk_radix_mark_lw (TILERT_GPU_TOPK_LW=1, opt-in, built in session 25 and not
#      yet run): TestKernelIndexer (its selections against refTopK on every top-k case, ties, narrow rows, lens, 8 rows,
#      scratch reused; fails unless it ran), the pair and the top-k alone graph-timed beside mark_l (TestKernelTimingIdxMLA:
#      rows "list w"), then the step A/B/A/B at 131072, 1 slot, both models, and one A/B at 4 slots. Make it the default
#      for the long rows only where both models gain in both pairs (then refuse TILERT_GPU_TOPK_LW=0 no longer: keep it
#      as the way back, and rerun check1).
#  check1 (~5 min; kernels.test, engine.test, tilert): the kernel checks and the engine's ^TestGPU.
#  check2 (~1 min; decode.test, cuda.test, cupti.test): the decode node's handoff on cuda, cuda, cupti.
#  final (~4 min; tilert): the README's rows, MTP and traced steps (plan.sh rows).
NAME=s26; . docs/measured/next/plan.sh "$1"
case "$P" in
lw)
  tst kernels cuda/kernels 200 'TestKernelIndexer$'; cnt kernels
  grep -E "list w" $R/kernels.log | grep -v PASS | head -20 >> $R/summary.txt
  (cd cuda/kernels && TILERT_GPU_TIMING=1 timeout 150 $D/kernels.test -test.run 'TestKernelTimingIdxMLA$' -test.v \
      -test.count=1 > $R/timing.log 2>&1)
  grep -E "graph: (scores\+hist, topk after hist|topk_radix) \((list|list w)\)" $R/timing.log >> $R/summary.txt; save
  for m in deepseek-v3.2 glm-5; do abab $m 131072 1 $m-lw TILERT_GPU_TOPK_LW=1; done
  bn deepseek-v3.2 131072 4 ds4-A; bn deepseek-v3.2 131072 4 ds4-B TILERT_GPU_TOPK_LW=1 ;;
check1)
  export TILERT_GPU_REPORT=$R/report.txt TILERT_ENGINE_REPORT=$R/engine-report.txt
  TSKIP='^TestNVRTC' tst kernels cuda/kernels 400 & tst engine engine/gpu 400 '^TestGPU' & wait
  for f in kernels engine; do cnt $f; done; save ;;
check2)
  tst decode roles/decode 90 'TestHandoff(EqualsLocalGeneration|MTPLen)/cuda'
  tst cuda cuda 120
  tst cupti cuda/cupti 60
  for f in decode cuda cupti; do cnt $f; done; save ;;
final) rows ;;
*) echo "usage: s26.sh lw|check1|check2|final" >&2; exit 2 ;;
esac
