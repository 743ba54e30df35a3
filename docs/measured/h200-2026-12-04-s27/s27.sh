# Session 26's plan for the next device session (issue 10; NOT RUN). Binaries of main in .device/next, xz'd or not
# (the build line in docs/measured/next/README.md). All six xz'd binaries (~22 MB) fit one call's carry with the tree
# (~39.5 MB since session 26 compressed the records' big logs; the limit is 64 MiB), so a call can run check1, check2
# and a part. Ask `status` first; issue each call right after the last (a machine stays warm ~30 s).
# Usage: bash docs/measured/next/s27.sh cp|short|four|hf|cap|check1|check2|gpucheck|final
#  cp (~8 min; kernels.test + tilert): indexer_scores_mma_cp / _rows_cp (TILERT_GPU_IDX_CP=1) and _cp2 / _rows_cp2
#      (=2: two groups a warp on rows over 32768 keys), built in session 26 after its device time: TestKernelIndexer
#      (both bit for bit against _pf, with the rings refilled at 2 x 140000 keys, and through the top-k; fails unless
#      they launched) and TestKernelSlotRows (against _rows); graph-timed beside _pf and the prefetch-free kernel
#      (TestKernelTimingIdxMLA rows "mma_cp", "mma_cp2", "scores_cp", "scores_cp2"). Then the step at 131072, 1 slot,
#      both models: default, =1, =2, default, =1, =2. Keep one the default only where both models gain (then check1
#      again).
#  short (~6 min; tilert): 8192, 1 slot, A/B/A/B: TILERT_GPU_IDX_CP=1 on both models, and the q chain forked right
#      before the scores at every length (TILERT_GPU_SIDE_Q_AT=scores-all). GLM-5's trace at 8192 (session 25 call D)
#      has q_b start when the scores end (24.7 us into the layer) and absorb_q end at 40.7, with the one-block top-k
#      ending at 34.8 beside it: forked before the scores, q_b would start ~6 us earlier, if the top-k does not slow
#      by as much. DeepSeek-V3.2 forks at q_a there (capped); scores-all is its other arm.
#  four (~6 min; tilert): what call C of session 26 lost: the 4-slot rows at 131072 A/B/A/B against
#      TILERT_GPU_TOPK_LW=0, the q chain forked before the scores at 4 slots (TILERT_GPU_SIDE_Q_AT=scores; qFork forks
#      several rows at q_a), IDX_CP at 4 slots, and a traced step of each model at 131072 on today's defaults (where
#      the front ends now that q_b runs beside the scores and mark_lw).
#  hf (~4 min; tilert): issue 10's HF comparison on today's code (last run in session 4: 9.34x / 9.14x against that
#      run's HF, 5.9x / 5.8x against HF's best run), with tilert's prefill in both precisions: the float32 default and
#      --prefill-precision fast (the "local prefill at least as fast as HF's at 8192").
#  check1 (~5 min; kernels.test, engine.test, tilert) / check2 (~1 min; decode.test, cuda.test, cupti.test) /
#      gpucheck (both in one call: all six binaries fit the carry now).
#  final (~4 min; tilert): the README's rows, MTP and traced steps at 8192 (plan.sh rows).
NAME=s27; . docs/measured/next/plan.sh "$1"
case "$P" in
cp)
  tst kernels cuda/kernels 240 'TestKernel(Indexer|SlotRows)$'; cnt kernels
  grep -E "_cp" $R/kernels.log | head -30 >> $R/summary.txt
  (cd cuda/kernels && TILERT_GPU_TIMING=1 timeout 150 $D/kernels.test -test.run 'TestKernelTimingIdxMLA$' -test.v \
      -test.count=1 > $R/timing.log 2>&1)
  grep -E "graph: (indexer_scores_mma|scores)" $R/timing.log >> $R/summary.txt; save
  for m in deepseek-v3.2 glm-5; do
    for r in A B; do
      bn $m 131072 1 $m-$r
      bn $m 131072 1 $m-cp1$r TILERT_GPU_IDX_CP=1
      bn $m 131072 1 $m-cp2$r TILERT_GPU_IDX_CP=2
    done
  done ;;
short)
  for m in glm-5 deepseek-v3.2; do
    abab $m 8192 1 $m-sca TILERT_GPU_SIDE_Q_AT=scores-all
  done ;;
four)
  for m in deepseek-v3.2 glm-5; do
    abab $m 131072 4 $m-lw4 TILERT_GPU_TOPK_LW=0
    bn $m 131072 4 $m-sc4 TILERT_GPU_SIDE_Q_AT=scores
  done
  TL=1 bn deepseek-v3.2 131072 1 tl-ds-long
  TL=1 bn glm-5 131072 1 tl-glm-long
  xz -T4 $R/tl-*.json 2>/dev/null; save ;;
hf)
  PYTHONUNBUFFERED=1 timeout 280 python3 scripts/hf_bench.py --tilert $D/tilert --preset deepseek-v3.2-moe \
      --model-dir /tmp/ds-moe --contexts 1024,8192 --tokens 32 --json $R/hf-bench.json > $R/hf-bench.log 2>&1
  echo "rc=$?" >> $R/hf-bench.log
  PYTHONUNBUFFERED=1 timeout 120 python3 scripts/hf_bench.py --tilert $D/tilert --model-dir /tmp/ds-moe \
      --contexts 1024,8192 --tokens 8 --skip-hf --no-context-bench --prefill-precision fast \
      --json $R/hf-fast.json > $R/hf-fast.log 2>&1
  echo "rc=$?" >> $R/hf-fast.log
  grep -E "^ +[0-9]+ |fastest|precision|rc=" $R/hf-bench.log $R/hf-fast.log >> $R/summary.txt; save ;;
cap)
  for r in A B; do
    for m in deepseek-v3.2 glm-5; do
      bn $m 131072 1 $m-$r
      bn $m 131072 1 $m-q1$r TILERT_GPU_SIDE_CAP=q=1
      bn $m 131072 1 $m-q2$r TILERT_GPU_SIDE_CAP=q=2
    done
  done
  TL=1 bn deepseek-v3.2 131072 1 tl-ds-q1 TILERT_GPU_SIDE_CAP=q=1
  TL=1 bn glm-5 131072 1 tl-glm-q2 TILERT_GPU_SIDE_CAP=q=2
  xz -T4 $R/tl-*.json 2>/dev/null; save ;;
check1) check1 ;;
check2) check2 ;;
gpucheck) gpucheck ;;
final) rows ;;
*) echo "usage: s27.sh cp|short|four|hf|cap|check1|check2|gpucheck|final" >&2; exit 2 ;;
esac
