# Session 58's device plan (issue 10). Usage: bash docs/measured/next/s58.sh x   (binaries in .device/next: tilert,
# kernels.test, engine.test)
#  x: the grouped routed experts on the tensor cores (TILERT_GPU_MOE_UNIQUE=x, gemv_mmx_fp8_r2_u1_pu) and the side
#     stream's shared expert read once for all rows (TILERT_GPU_SIDE_SH_ONCE=1). Session 58 call A's trace of 4
#     same-row slots had the grouped tile kernels streaming at 0.9-1.4 TB/s and the shared expert read once a row.
#     Checks first (TestKernelExpertsUniqueMMA: each slot's output equals the one-row tensor-core GEMV's bit for bit;
#     the engine's launches and greedy == CPU), then A/B/A/B at 8192 against the default: 4 slots --same-rows and
#     random routing (DeepSeek-V3.2 dims, GLM-5 dims same rows), the MTP step, 2 slots; each switch alone on same
#     rows; 8 slots and MTP at 4 slots once each; a trace of 4 same-row slots with both.
NAME=s58
. docs/measured/next/plan.sh "$1"
case "$PART" in
x)
  export TILERT_GPU_REPORT=$R/report.txt TILERT_ENGINE_REPORT=$R/engine-report.txt
  tst kernels cuda/kernels 150 'TestKernelExpertsUnique(MMA)?$|TestKernelGemvMMA|TestKernelGateUpMMA|TestPDL' &
  tst engine engine/gpu 300 '^TestGPU(MoEUniqueMMA|GreedyMatchesCPUMoEUniqueMMA|MoEUniqueEqual)$' & wait
  for f in kernels engine; do cnt $f; done; save
  if grep -q -- '--- FAIL' $R/kernels.log $R/engine.log; then echo "mma unique checks FAIL: no step runs" >> $R/summary.txt; save; exit 0; fi
  XO="TILERT_GPU_MOE_UNIQUE=x TILERT_GPU_SIDE_SH_ONCE=1"
  SAMP=--same-rows abab deepseek-v3.2 8192 4 x-same-ds $XO
  SAMP=--same-rows bn deepseek-v3.2 8192 4 x-same-ds-xonly TILERT_GPU_MOE_UNIQUE=x
  SAMP=--same-rows bn deepseek-v3.2 8192 4 x-same-ds-once TILERT_GPU_SIDE_SH_ONCE=1
  abab deepseek-v3.2 8192 4 x-ds $XO; save
  SAMP=--same-rows abab glm-5 8192 4 x-same-glm $XO
  MTP=1 abab deepseek-v3.2 8192 1 x-mtp-ds $XO
  abab deepseek-v3.2 8192 2 x-2-ds $XO; save
  bn deepseek-v3.2 8192 8 x-8-ds-A; bn deepseek-v3.2 8192 8 x-8-ds-B $XO
  MTP=1 bn deepseek-v3.2 8192 4 x-mtp4-ds-A; MTP=1 bn deepseek-v3.2 8192 4 x-mtp4-ds-B $XO; save
  SAMP=--same-rows TL=1 bn deepseek-v3.2 8192 4 x-tl-same4 $XO; xz -T4 $R/x-tl-*.json 2>/dev/null; save ;;
d)
  # The defaults of call B's forms (the real models' dims: grouped experts on the tensor cores at 2+ rows, the side
  # shared expert once) against the tile kernels' grouping (=1, the previous default at 3-4 rows) without the shared
  # expert once; bench decode gives each slot its own synthetic state now (--one-state: the earlier bench). Then
  # gpu-check's first half.
  OLD="TILERT_GPU_MOE_UNIQUE=1 TILERT_GPU_SIDE_SH_ONCE=0"
  abab deepseek-v3.2 8192 4 d-ds $OLD
  SAMP=--one-state bn deepseek-v3.2 8192 4 d-one-ds-A; SAMP=--one-state bn deepseek-v3.2 8192 4 d-one-ds-B $OLD; save
  abab glm-5 8192 4 d-glm $OLD
  SAMP=--same-rows JS=1 bn deepseek-v3.2 8192 1,4 d-same-ds; SAMP=--same-rows JS=1 bn glm-5 8192 1,4 d-same-glm; save
  JS=1 bn deepseek-v3.2 8192 1,2,4,8 d-rows-ds; JS=1 bn glm-5 8192 1,4 d-rows-glm; save
  MTP=1 bn deepseek-v3.2 8192 1,4 d-mtp-ds-A; MTP=1 bn deepseek-v3.2 8192 1,4 d-mtp-ds-B $OLD; save
  check1 ;;
r)
  # The README's rows on today's main (an H200's table if one comes), a 4-slot row on one state for the bench's
  # record, and traces of 4 and 2 slots of their own states.
  JS=1 bn deepseek-v3.2 8192,131072 1,4 r-ds; JS=1 bn glm-5 8192,131072 1,4 r-glm; save
  MTP=1 JS=1 bn deepseek-v3.2 8192 1,4 r-mtp-ds; SAMP=--same-rows JS=1 bn deepseek-v3.2 8192 1,4 r-same-ds
  SAMP=--one-state bn deepseek-v3.2 8192 4 r-one-ds; save
  TL=1 bn deepseek-v3.2 8192 4 r-tl4; TL=1 bn deepseek-v3.2 8192 2 r-tl2; xz -T4 $R/r-tl-*.json 2>/dev/null; save ;;
*) echo "usage: s58.sh x|d|r" >&2; exit 2 ;;
esac
