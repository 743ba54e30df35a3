# Session 57's device plan (issue 10). Usage: bash docs/measured/next/s57.sh b   (binaries in .device/next:
# tilert, kernels.test)
#  b (ran as call A, docs/measured/h100-2026-12-07-s57; needs binaries of 2641a67: gemv_bulk lost and was removed
#     after): the bulk-copy probe and GEMV first. TestKernelTimingSMRate streams 1 MiB a block on 1..all SMs with 16-byte
#     ld.global (the tile GEMVs' form), 16-byte cp.async (the staged GEMV's) and cp.async.bulk (none yet): whether an
#     SM streams past its share of the copy rate when fewer stream. TestKernelGemvBulk checks gemv_bulk against the
#     tile kernels of its G bit for bit, the CPU reference and a programmatic chain; TestKernelTimingBulk times it
#     against today's plan and _d16s alone. Then DeepSeek-V3.2 dims' o_proj on it (TILERT_GPU_OPROJ=G64/R8_bk/B0) and
#     on session 56's queued spread plan (G64/R8_d16s/B0), A/B/A/B at 8192 and 131072, 1 slot; GLM-5 dims' o_proj
#     on bulk at 8192; q_b on bulk (G32, DeepSeek-V3.2 dims) at 8192.
#  u: the routed experts grouped by expert (TILERT_GPU_MOE_UNIQUE=1, moe_unique.go; binaries tilert, kernels.test,
#     engine.test): TestKernelExpertsUnique (the grouped launches equal the per-slot ones bit for bit) and the
#     engine's TestGPUMoEUniqueEqual / TestGPUGreedyMatchesCPUMoEUnique, then A/B/A/B at 8192: 4 slots with
#     --same-rows (every row on the same experts) and on random routing, both models, and the MTP step.
#  h (queued: no H200 came in session 57): the grouped experts' default (rounds of 3-4 rows) on an H200 against
#     TILERT_GPU_MOE_UNIQUE=0, A/B/A/B at 8192: 4 slots random routing and --same-rows on both models, 2 slots with MTP
#     (4 rows), 2 slots (=1 against the default: 2-row rounds are left per slot); a trace of 4 same-row slots (where
#     the rest of a 4-row step's time goes, the experts streaming once); then make gpu-check's first half (check1).
#  o: the rest of session 56's queued plan (`s56.sh o`): the H100-chosen defaults not yet A/B'd on an H200, block
#     clocks on both models at 8192, and `--same-rows` at 1 and 4 slots.
NAME=s57
. docs/measured/next/plan.sh "$1"
case "$PART" in
b)
  (cd cuda/kernels && TILERT_GPU_TIMING=1 timeout 120 $D/kernels.test -test.v -test.run 'TestKernelTimingSMRate$' > $R/smrate.log 2>&1)
  grep -E "sm rate" $R/smrate.log | sed 's/^ *smrate_timing_test.go:[0-9]*: //' >> $R/summary.txt
  export TILERT_GPU_REPORT=$R/report.txt
  tst kernels cuda/kernels 200 'TestKernelGemvBulk$|TestPDL|TestKernelGemvStage$|TestKernelTilePlanBitwise'; cnt kernels
  (cd cuda/kernels && TILERT_GPU_TIMING=1 timeout 150 $D/kernels.test -test.v -test.run 'TestKernelTimingBulk$' > $R/tbulk.log 2>&1)
  grep -E "bulk:" $R/tbulk.log | sed 's/^ *gemv_bulk_test.go:[0-9]*: //' >> $R/summary.txt; save
  if grep -q -- '--- FAIL' $R/kernels.log; then echo "bulk checks FAIL: no step runs" >> $R/summary.txt; save; exit 0; fi
  abab deepseek-v3.2 8192 1 bk-ds TILERT_GPU_OPROJ=G64/R8_bk/B0
  bn deepseek-v3.2 8192 1 sp-ds TILERT_GPU_OPROJ=G64/R8_d16s/B0
  abab deepseek-v3.2 131072 1 bk-ds131 TILERT_GPU_OPROJ=G64/R8_bk/B0
  abab glm-5 8192 1 bk-glm TILERT_GPU_OPROJ=G64/R8_bk/B0
  abab deepseek-v3.2 8192 1 qbk-ds TILERT_GPU_TILE_PLANS=24576x1536=G32/R8_bk/B0
  TL=1 bn deepseek-v3.2 8192 1 tl-bk TILERT_GPU_OPROJ=G64/R8_bk/B0
  xz -T4 $R/tl-*.json 2>/dev/null; save ;;
u)
  export TILERT_GPU_REPORT=$R/report.txt TILERT_ENGINE_REPORT=$R/engine-report.txt
  tst kernels cuda/kernels 150 'TestKernelExpertsUnique$|TestUniqueTable$|TestKernelGemvTile$|TestPDL' &
  tst engine engine/gpu 200 '^TestGPU(MoEUniqueEqual|GreedyMatchesCPUMoEUnique)$' & wait
  for f in kernels engine; do cnt $f; done; save
  if grep -q -- '--- FAIL' $R/kernels.log $R/engine.log; then echo "unique checks FAIL: no step runs" >> $R/summary.txt; save; exit 0; fi
  U=TILERT_GPU_MOE_UNIQUE=1
  SAMP=--same-rows abab deepseek-v3.2 8192 4 uq-same-ds $U
  abab deepseek-v3.2 8192 4 uq-ds $U
  MTP=1 abab deepseek-v3.2 8192 1 uq-mtp-ds $U
  [ -z "$SHORT" ] && SAMP=--same-rows abab glm-5 8192 4 uq-same-glm $U; save
  [ -n "$U28" ] && { SAMP=--same-rows bn deepseek-v3.2 8192 2,8 uq-same28-ds-A; SAMP=--same-rows bn deepseek-v3.2 8192 2,8 uq-same28-ds-B $U; }
  save ;;
h)
  U0=TILERT_GPU_MOE_UNIQUE=0
  abab deepseek-v3.2 8192 4 h-ds $U0; abab glm-5 8192 4 h-glm $U0
  SAMP=--same-rows abab deepseek-v3.2 8192 4 h-same-ds $U0; SAMP=--same-rows abab glm-5 8192 4 h-same-glm $U0; save
  MTP=1 abab deepseek-v3.2 8192 2 h-mtp2-ds $U0
  abab deepseek-v3.2 8192 2 h-2-ds TILERT_GPU_MOE_UNIQUE=1; save
  SAMP=--same-rows TL=1 bn deepseek-v3.2 8192 4 h-tl-same4; xz -T4 $R/h-tl-*.json 2>/dev/null; save
  check1 ;;
o)
  abab deepseek-v3.2 8192 1 es-ds TILERT_GPU_EXPERT_SHAPE=30; abab glm-5 8192 1 es-glm TILERT_GPU_EXPERT_SHAPE=30
  abab deepseek-v3.2 8192 1 ac-ds TILERT_GPU_AHEAD_COPY=0; save
  abab deepseek-v3.2 131072 1 mp-ds131 TILERT_GPU_MAIN_PRIO=1; abab glm-5 131072 1 mp-glm131 TILERT_GPU_MAIN_PRIO=1
  abab glm-5 131072 1 iw-glm131 TILERT_GPU_IDX_WGH=2short; save
  TL=1 bn deepseek-v3.2 8192 1 tl-dsc TILERT_GPU_BLOCK_CLOCKS=1
  TL=1 bn glm-5 8192 1 tl-glmc TILERT_GPU_BLOCK_CLOCKS=1
  xz -T4 $R/tl-*.json 2>/dev/null; save
  SAMP=--same-rows JS=1 bn deepseek-v3.2 8192 1,4 same-ds
  SAMP=--same-rows JS=1 bn glm-5 8192 1,4 same-glm; save ;;
*) echo "usage: s57.sh b|u|h|o" >&2; exit 2 ;;
esac
