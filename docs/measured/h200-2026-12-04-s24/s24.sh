# Session 23's plan for the next device session (issue 10; NOT RUN). Binaries of main in .device/next, xz'd or not
# (the build line in docs/measured/next/README.md). The working tree plus all five binaries is over the 64 MiB carry
# limit: carry kernels.test, engine.test and tilert for `check` first, then decode.test, cuda.test, cupti.test (and
# tilert) in a second, warm call that runs `check` again (the absent binaries' parts fail fast with rc=127).
# Ask `status` first.
# Usage: bash docs/measured/next/s24.sh check|sh|long|ncu|sc|fin|final
#  check (~7 min; plan.sh gpucheck): make gpu-check's correctness parts (kernel checks; the engine's ^TestGPU; the decode node's
#        handoff; cuda; cupti), for whatever changed since session 23's calls B-C (all PASS there).
#  sh (~4 min): session 23 call D's one open question, the shared expert's side GEMVs uncapped
#        (TILERT_GPU_SIDE_CAP=sh=0: -5 / -6 us a step there, inside the spread), A/B/A/B at 8192, 1 slot on both
#        models and A/B at 4 slots; change sideCapFor's default only if both models gain in both pairs.
#  long (~2 min): a traced step of each model at 131072, 1 slot (no trace at that length since session 14's profile):
#        where the long rows' time goes, against the 1-3 points they miss 70% by.
#  ncu (~3 min): the indexer scores and the long-row top-k at 131072, the layer input's group GEMV, the one-block
#        top-k and absorb_q at 8192 under ncu (full set, SASS stall samples), 1 MoE layer: what binds each.
#  sc (~6 min; kernels.test + tilert of the scale-prefetch commit): the indexer checks (TestKernelIndexer: the scores
#        against the CPU, pfl == pf bit for bit), the pair graph-timed with and without TILERT_GPU_IDX_SCALE_LATE=1,
#        and the step A/B/A/B at 8192 and 131072, 1 slot, both models (default = scales with the keys).
#  fin (~8 min, the kernels' NVRTC compile checks skipped; kernels.test, engine.test, tilert of the top-k commit: the carry holds three binaries): the kernel
#        checks and the engine's ^TestGPU side by side (the decode node's handoff, cuda and cupti do not travel: none
#        changed since session 23, where they passed), the indexer pair graph-timed with the session-23 forms
#        (TILERT_GPU_IDX_SCALE_LATE=1 TILERT_GPU_TOPK_KEYS_LATE=1 TILERT_GPU_MARK_LOADS_LATE=1) and without, the README's
#        rows (JSON) and the 1-slot rows with the session-23 forms A/B/A, and the MTP step.
#  final (~4 min): the README's rows, the MTP step and a traced step of each model (plan.sh rows).
NAME=s24; . docs/measured/next/plan.sh "$1"
case "$P" in
check) gpucheck ;;
final) rows ;;
fin)
  export TILERT_GPU_REPORT=$R/report.txt TILERT_ENGINE_REPORT=$R/engine-report.txt
  # The NVRTC compile checks need no GPU (CI runs them; ~4 min of one core here): skipped on the device.
  TSKIP='^TestNVRTC' tst kernels cuda/kernels 400 & tst engine engine/gpu 400 '^TestGPU' & wait
  for f in kernels engine; do cnt $f; done; save
  L="TILERT_GPU_IDX_SCALE_LATE=1 TILERT_GPU_TOPK_KEYS_LATE=1 TILERT_GPU_MARK_LOADS_LATE=1"
  for v in 0 1; do (cd cuda/kernels && env TILERT_GPU_TIMING=1 $([ $v = 1 ] && echo $L) timeout 100 $D/kernels.test \
      -test.run 'TestKernelTimingIdxMLA$' -test.v -test.count=1 > $R/timing-late$v.log 2>&1)
    grep -E "^graph: (indexer_scores_mma\+hist|scores\+hist, topk after hist \((one block|list)\)) rows=" $R/timing-late$v.log | sed "s|^|late=$v |" >> $R/summary.txt; done; save
  JS=1 bn deepseek-v3.2 8192,131072 1,4 ds
  bn deepseek-v3.2 8192,131072 1 ds-late $L
  bn deepseek-v3.2 8192,131072 1 ds-A2
  JS=1 bn glm-5 8192,131072 1,4 glm
  bn glm-5 8192,131072 1 glm-late $L
  bn glm-5 8192,131072 1 glm-A2
  MTP=1 bn deepseek-v3.2 8192 1 ds-mtp ;;
sc)
  tst kernels cuda/kernels 200 'TestKernelIndexer$|TestNVRTCIndexerScoresRegisters'; cnt kernels
  for v in 0 1; do (cd cuda/kernels && TILERT_GPU_TIMING=1 TILERT_GPU_IDX_SCALE_LATE=$v timeout 200 $D/kernels.test \
      -test.run 'TestKernelTimingIdxMLA$' -test.v -test.count=1 > $R/timing-late$v.log 2>&1)
    grep -E "indexer_scores_mma\+hist|one block\) rows=1|list\) rows=1" $R/timing-late$v.log | sed "s|^|late=$v |" >> $R/summary.txt; done; save
  for m in deepseek-v3.2 glm-5; do
    bn $m 8192,131072 1 $m-A
    bn $m 8192,131072 1 $m-late TILERT_GPU_IDX_SCALE_LATE=1
    bn $m 8192,131072 1 $m-A2
    bn $m 8192,131072 1 $m-late2 TILERT_GPU_IDX_SCALE_LATE=1
  done ;;
ncu)
  NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
  nc() { local n=$1 c=$2 k=$3; timeout 200 $NCU --clock-control none --set full --import-source no --launch-skip 4 \
      --launch-count $4 -k regex:"$k" -o $R/$n $D/tilert bench decode --device cuda --dummy-weights deepseek-v3.2 \
      --layers 1 --context $c --batches 1 > $R/$n-run.txt 2>&1; echo rc=$? >> $R/$n-run.txt
    $NCU -i $R/$n.ncu-rep --page details > $R/$n-details.txt 2>&1
    $NCU -i $R/$n.ncu-rep --page source --csv --print-source sass > $R/$n-sass.csv 2>&1; xz -T4 $R/$n-sass.csv; save; }
  nc long 131072 'indexer_scores_mma_pf|topk_radix_mark_l' 2
  nc short 8192 'gemv_group_r8_m1|topk_radix_one_w|absorb_q_fast' 3
  grep -E "^  [a-z_0-9]+|Duration|Memory Throughput|DRAM Throughput|Compute \(SM\) Throughput|Registers Per|Achieved Occupancy|Issue Slots Busy|No Eligible" $R/*-details.txt | tee -a $R/summary.txt; save ;;
long)
  TL=1 bn deepseek-v3.2 131072 1 tl-ds-long
  TL=1 bn glm-5 131072 1 tl-glm-long
  xz -T4 $R/tl-*.json; save ;;
sh)
  for m in deepseek-v3.2 glm-5; do
    bn $m 8192 1 $m-A
    bn $m 8192 1 $m-sh0 TILERT_GPU_SIDE_CAP=sh=0
    bn $m 8192 1 $m-A2
    bn $m 8192 1 $m-sh0b TILERT_GPU_SIDE_CAP=sh=0
  done
  bn deepseek-v3.2 8192 4 ds4-A
  bn deepseek-v3.2 8192 4 ds4-sh0 TILERT_GPU_SIDE_CAP=sh=0 ;;
*) echo "usage: s24.sh check|sh|long|ncu|sc|fin|final" >&2; exit 2 ;;
esac
