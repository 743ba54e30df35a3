# Session 53's device plan (issue 10). Usage: bash docs/measured/next/s53.sh go|st|sc|df|dq|h5   (binaries in .device/next)
#  go (any card): on an H200, s51.sh h5 (every README row with traced steps, then the A/Bs still owed there; H5S
#    seconds, default 400). On an H100, what s52.sh rt left: moe_route_sort's graph time beside moe_route_rank's
#    and moe_route's (TestKernelSmallTiming).
#  st (any card; kernels.test, tilert): the staged wq_b (gemv_stage_fp8_r8_m1, the tile plan variant _st, built this
#    session): each block copies its whole share of wq_b into shared memory before its PDL wait, while the layer-input
#    grouped GEMV still streams, so that after q_a only the products remain. TestKernelGemvStage (bit for bit the tile
#    G32/R8 plan, float64, programmatic behind a writer of x, eager and graphed) and TestKernelTilePlanBitwise; a
#    traced step of each model with block clocks and the pin (when do its blocks become resident, how long after
#    their release do they leave); then A/B/A/B at 8192 on both models and at 131072 on DeepSeek-V3.2 dims.
#  sc (any card; kernels.test, tilert): st again with the grouped GEMVs asking for the most shared memory
#    (kernels.stageBehind; call A's clocks had the staged blocks resident only after the grouped GEMV left, the SMs'
#    carveout holding no room for 96 KB): TestKernelGemvStage, the traced steps, the four A/B/A/Bs, then the
#    carveout's own A/B (TILERT_GPU_STAGE_CARVEOUT=0) on GLM-5 dims at 8192.
#  df (any card; engine.test, tilert): the staged wq_b as the engine's default (TILERT_GPU_WQB_STAGE, wqb.go):
#    TestGPUWqbStage (real DeepSeek-V3.2 dims: staged launches only by default, the same greedy tokens as the tile
#    kernel), TestGPUGreedyMatchesCPU and TestGPUGraphsEqualEager; A/B/A/B of the default against
#    TILERT_GPU_WQB_STAGE=0 on both models at 8192 and 131072, and a 60% carveout for the grouped GEMVs on GLM-5 dims.
#  dq (any card; engine.test, tilert): df's first part (TestGPUWqbStage, the two 8192 A/B/A/Bs) for a short budget.
#  h5 (an H200; tilert alone): s51.sh h5 (H5S seconds, default 330), then df's A/Bs of the staged wq_b.
# Session 54 ran df's rows (s54.sh a and its call B) and removed TILERT_GPU_STAGE_CARVEOUT: sc, cv8 and df's c60 row
# are refused since.
NAME=s53
. docs/measured/next/plan.sh "$1"
blocks() { awk '/as it ran/{f=1} f' $R/$1.txt | grep -v "^rc=" | head -60 | sed "s|^|$1 |" >> $R/summary.txt; }
DSP=TILERT_GPU_TILE_PLANS=8192x1536=G32/R8_st/B0
GLP=TILERT_GPU_TILE_PLANS=4096x2048=G32/R8_st/B0
stab() {
  abab deepseek-v3.2 8192 1 st8 $DSP
  abab glm-5 8192 1 sg8 $GLP
  abab deepseek-v3.2 131072 1 st131 $DSP
  abab glm-5 131072 1 sg131 $GLP
}
# dfab: the staged wq_b (the default since call B) against TILERT_GPU_WQB_STAGE=0, both models, both contexts.
dfab() {
  abab glm-5 8192 1 d-g8 TILERT_GPU_WQB_STAGE=0
  abab deepseek-v3.2 8192 1 d-d8 TILERT_GPU_WQB_STAGE=0
  abab glm-5 131072 1 d-g131 TILERT_GPU_WQB_STAGE=0
  abab deepseek-v3.2 131072 1 d-d131 TILERT_GPU_WQB_STAGE=0
}
case "$PART" in
go)
  if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then
    timeout ${H5S:-400} bash docs/measured/next/s51.sh h5 > $R/s51-h5.log 2>&1; echo "s51 h5 rc=$?" >> $R/summary.txt
    cp $OUT/summary-h5.txt $R/s51-summary-h5.txt 2>/dev/null; cat $R/s51-summary-h5.txt >> $R/summary.txt; save
  else
    export TILERT_GPU_TIMING=1; tst kernels cuda/kernels 200 '^TestKernelSmallTiming$'; unset TILERT_GPU_TIMING
    cnt kernels; grep -E "moe_route" $R/kernels.log | head -20 >> $R/summary.txt; save
  fi ;;
st)
  tst kernels cuda/kernels 200 '^TestKernelGemvStage$|^TestKernelTilePlanBitwise$'; cnt kernels
  grep -E "gemv_stage" $R/kernels.log | head -30 >> $R/summary.txt; save
  TL=1 bn deepseek-v3.2 8192 1 tl-dsst TILERT_GPU_BLOCK_CLOCKS=1 $DSP
  TL=1 bn glm-5 8192 1 tl-glst TILERT_GPU_BLOCK_CLOCKS=1 $GLP
  for f in tl-dsst tl-glst; do blocks $f; done
  xz -T4 $R/tl-*.json 2>/dev/null; save
  stab; save ;;
sc)
  tst kernels cuda/kernels 200 '^TestKernelGemvStage$'; cnt kernels; save
  TL=1 bn deepseek-v3.2 8192 1 tl-dsst TILERT_GPU_BLOCK_CLOCKS=1 $DSP
  TL=1 bn glm-5 8192 1 tl-glst TILERT_GPU_BLOCK_CLOCKS=1 $GLP
  for f in tl-dsst tl-glst; do blocks $f; done
  xz -T4 $R/tl-*.json 2>/dev/null; save
  stab
  abab glm-5 8192 1 cv8 $GLP TILERT_GPU_STAGE_CARVEOUT=0; save ;;
df)
  tst engine engine/gpu 300 '^TestGPUWqbStage$|^TestGPUGreedyMatchesCPU$|^TestGPUGraphsEqualEager$'; cnt engine
  grep -E "staged launches|tokens differ" $R/engine.log | head -5 >> $R/summary.txt; save
  dfab
  abab glm-5 8192 1 c60 TILERT_GPU_STAGE_CARVEOUT=60; save ;;
dq)
  tst engine engine/gpu 150 '^TestGPUWqbStage$'; cnt engine
  grep -E "staged launches|tokens differ" $R/engine.log | head -5 >> $R/summary.txt; save
  abab glm-5 8192 1 d-g8 TILERT_GPU_WQB_STAGE=0
  abab deepseek-v3.2 8192 1 d-d8 TILERT_GPU_WQB_STAGE=0; save ;;
h5)
  timeout ${H5S:-330} bash docs/measured/next/s51.sh h5 > $R/s51-h5.log 2>&1; echo "s51 h5 rc=$?" >> $R/summary.txt
  cp $OUT/summary-h5.txt $R/s51-summary-h5.txt 2>/dev/null; cat $R/s51-summary-h5.txt >> $R/summary.txt; save
  dfab; save ;;
*) echo "usage: s53.sh go|st|sc|df|dq|h5" >&2; exit 2 ;;
esac
