# Session 24's plan for the next device session (issue 10; NOT RUN). Binaries of main in .device/next, xz'd or not
# (the build line in docs/measured/next/README.md). The working tree plus more than three xz'd binaries is over the
# 64 MiB carry limit, so the checks take two calls: carry kernels.test, engine.test and tilert for `check1` (then
# `final` in the same call if it fits: ~5 + ~4 min), then decode.test, cuda.test and cupti.test for `check2`.
# Ask `status` first.
# Usage: bash docs/measured/next/s25.sh check1|check2|nopf|nn|final|d|e|f (d, e, f: session 25's last calls, below)
#  check1 (~5 min): the kernel checks (the NVRTC compile checks skipped: CI runs them) and the engine's ^TestGPU.
#  check2 (~2 min): the decode node's handoff on cuda, the cuda and cupti packages' GPU tests.
#  nopf (~5 min; kernels.test + tilert): the scores without the prefetch (indexer_scores_mma: 3 blocks an SM) graph-timed
#        beside _pf, then the step A/B/A/B with TILERT_GPU_IDX_NOPF=1 at 8192 and 131072, 1 slot, both models; make it
#        the default (for rows over some length, if only there) only where both models gain in both pairs.
#  nn (~4 min; kernels.test + tilert): gemv_group_r8_m1_nn (TILERT_GPU_GROUP_NN=1: the layer input's group without the
#        predicated norm multiplies): TestKernelGemvGroup (its bits against gemv_group_r8_m1's), the group graph-timed
#        with and without it (TestKernelGroupTiming), then the step A/B/A/B at 8192, 1 slot, both models.
#  final (~4 min): the README's rows (both models, 8192 and 131072, 1 and 4 slots, JSON), MTP and a traced step of
#        each model (plan.sh rows), on one machine, for the README's top rows.
NAME=s25; . docs/measured/next/plan.sh "$1"
case "$P" in
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
nn)
  tst kernels cuda/kernels 200 'TestKernelGemvGroup$'; cnt kernels
  for v in 0 1; do (cd cuda/kernels && TILERT_GPU_TIMING=1 TILERT_GPU_GROUP_NN=$v timeout 100 $D/kernels.test \
      -test.run 'TestKernelGroupTiming$' -test.v -test.count=1 > $R/timing-nn$v.log 2>&1)
    grep -E "graph" $R/timing-nn$v.log | grep -v timing_test | head -30 | sed "s|^|nn=$v |" >> $R/summary.txt; done; save
  for m in deepseek-v3.2 glm-5; do abab $m 8192 1 $m-nn TILERT_GPU_GROUP_NN=1; done ;;
nopf)
  (cd cuda/kernels && TILERT_GPU_TIMING=1 timeout 100 $D/kernels.test -test.run 'TestKernelTimingIdxMLA$' -test.v \
      -test.count=1 > $R/timing.log 2>&1)
  grep -E "^graph: indexer_scores_mma" $R/timing.log >> $R/summary.txt; save
  for m in deepseek-v3.2 glm-5; do abab $m 8192,131072 1 $m-nopf TILERT_GPU_IDX_NOPF=1; done ;;
d)
  # Session 25's last call: the two-rounds group kernels' bits and timing, the step with =2, the q chain forked at q_a
  # at 131072 (the top-k's scores are faster since session 17 chose the late fork); the README's rows first.
  tst kernels cuda/kernels 200 'TestKernelGemvGroup$'; cnt kernels
  for v in 0 1 2 3; do (cd cuda/kernels && TILERT_GPU_TIMING=1 TILERT_GPU_GROUP_NN=$v timeout 60 $D/kernels.test \
      -test.run 'TestKernelGroupTiming$' -test.v -test.count=1 > $R/timing-nn$v.log 2>&1)
    grep -E "attn in .*gemv_group M=1 " $R/timing-nn$v.log | sed "s|^|nn=$v |" >> $R/summary.txt; done; save
  rows
  for m in deepseek-v3.2 glm-5; do abab $m 8192 1 $m-nn2 TILERT_GPU_GROUP_NN=2; done
  abab deepseek-v3.2 131072 1 ds-qa TILERT_GPU_SIDE_Q_AT=qa ;;
e)
  # After d, warm (tilert still in .device/next): check2's tests, then GLM-5's q chain forked at q_a at 131072.
  tst decode roles/decode 90 'TestHandoff(EqualsLocalGeneration|MTPLen)/cuda'
  tst cuda cuda 120
  tst cupti cuda/cupti 60
  for f in decode cuda cupti; do cnt $f; done; save
  abab glm-5 131072 1 glm-qa TILERT_GPU_SIDE_Q_AT=qa ;;
f)
  # The last of session 25's device time: GLM-5's q chain forked at q_a at 131072 (call D ran DeepSeek-V3.2's), then a
  # traced step of each model at 131072 on today's code (session 24's traces predate the scores' scale prefetch).
  abab glm-5 131072 1 glm-qa TILERT_GPU_SIDE_Q_AT=qa
  TL=1 bn deepseek-v3.2 131072 1 tl-ds-long
  TL=1 bn glm-5 131072 1 tl-glm-long
  xz -T4 $R/tl-*.json 2>/dev/null; save ;;
*) echo "usage: s25.sh check1|check2|nopf|nn|final|d|e|f" >&2; exit 2 ;;
esac
