# Session 54's device plan (issue 10). Usage: bash docs/measured/next/s54.sh a|k|t|h   (binaries in .device/next)
#  a (any card; kernels.test, engine.test, tilert): on an H200, s53.sh h5 (every README row, then the A/Bs of the
#    staged wq_b). On an H100, what session 53 left unrun: make gpu-check's first half (every kernel check with
#    TestKernelSmallFast on moe_route_sort after the review's mend, TestKernelGemvStage; the engine's ^TestGPU with
#    TestGPUWqbStage), then A/B/A/Bs of the staged wq_b default against TILERT_GPU_WQB_STAGE=0 and of a 50% carveout
#    for the grouped GEMVs (L1 kept at ~124 KB where 100% left 28).
#  k (kernels.test, engine.test, decode.test, cuda.test, cupti.test): make gpu-check's correctness parts (check1,
#    check2) after 43 unreachable kernels were removed and their tests rewritten (cuda/kernels/NOTES.md "Unreachable
#    kernels removed").
#  t (tilert): on an H200 only, the four target rows (1 slot, 8192 and 131072, both models), for a short
#    budget.
#  h (tilert; decode.test, cuda.test, cupti.test): on an H200, s53.sh h5; on an H100, make gpu-check's second half
#    (check2: the decode node's handoff on cuda, the cuda and cupti packages).
NAME=s54
. docs/measured/next/plan.sh "$1"
case "$PART" in
a)
  if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then
    timeout ${H5S:-500} bash docs/measured/next/s53.sh h5 > $R/s53-h5.log 2>&1; echo "s53 h5 rc=$?" >> $R/summary.txt
    cp $OUT/summary-h5.txt $R/s53-summary-h5.txt 2>/dev/null; cat $R/s53-summary-h5.txt >> $R/summary.txt; save
  else
    # make gpu-check's first half (every kernel check, the engine's ^TestGPU): sessions 52-53 changed the routing and wq_b
    export TILERT_GPU_REPORT=$R/report.txt TILERT_ENGINE_REPORT=$R/engine-report.txt
    TSKIP='^TestNVRTC' tst kernels cuda/kernels 330 & tst engine engine/gpu 330 '^TestGPU' & wait
    cnt kernels; cnt engine
    grep -E "staged launches|tokens differ" $R/engine.log | head -5 >> $R/summary.txt; save
    abab glm-5 8192 1 d-g8 TILERT_GPU_WQB_STAGE=0
    abab glm-5 8192 1 c50 TILERT_GPU_STAGE_CARVEOUT=50
    abab deepseek-v3.2 8192 1 d-d8 TILERT_GPU_WQB_STAGE=0; save
  fi ;;
k)
  # after the unreachable kernels' removal (88680c6): both halves of make gpu-check's correctness parts
  TILERT_GPU_REPORT=$R/report.txt check1
  check2 ;;
t)
  # a short budget's H200 target rows (1 slot, both models, 8192 and 131072); nothing on another card
  if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then
    JS=1 bn deepseek-v3.2 8192,131072 1 ds1
    JS=1 bn glm-5 8192,131072 1 glm1
  fi ;;
h)
  if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then
    timeout ${H5S:-520} bash docs/measured/next/s53.sh h5 > $R/s53-h5.log 2>&1; echo "s53 h5 rc=$?" >> $R/summary.txt
    cp $OUT/summary-h5.txt $R/s53-summary-h5.txt 2>/dev/null; cat $R/s53-summary-h5.txt >> $R/summary.txt; save
  else
    check2
  fi ;;
# call B ran, on the same warm machine, this preamble with three A/B/A/Bs: the staged wq_b's default against
# TILERT_GPU_WQB_STAGE=0 on both models at 131072, and TILERT_GPU_STAGE_CARVEOUT=60 on GLM-5 dims at 8192. The
# carveout was removed after it (refused since), so c50 here no longer runs.
*) echo "usage: s54.sh a|k|t|h" >&2; exit 2 ;;
esac
