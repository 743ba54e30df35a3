# Session 56's device plan (issue 10). Usage: bash docs/measured/next/s56.sh a   (binaries in .device/next:
# tilert, kernels.test, engine.test)
#  a: on an H200, the four 1-slot target rows first (both models, 8192 and 131072, JSON; none taken on an
#     H200 since session 42), then q_b on the staged GEMV at 8192 (A/B/A/B, both models); on another card the
#     A/B/A/Bs at 8192, the checks the session-55 removals and the session-56 stageRows change touch, then 131072.
#     q_b is pinned by TILERT_GPU_TILE_PLANS (no new code): DeepSeek-V3.2 dims 24576 x 1536 in 64-row blocks (96 KB,
#     two an SM), GLM-5 dims 16384 x 2048 in 32-row blocks (64 KB; 64 rows would be 128 KB, one an SM).
#  o (tilert; queued after call D: too little device time was left to start a machine; session 57 ran the spread plan
#     once on an H100, no gain, and moved the rest of this part to s57.sh o): DeepSeek-V3.2 dims' o_proj
#     (7168 x 16384) on the spread plan G64/R8_d16s/B0, its busiest SM 56 rows instead of 64 (54.3 the mean; the H200
#     trace of session 56 call B has o_proj at 34.0 us against 27.8 of bytes). kernels.SpreadPlan leaves it because it
#     cuts under a fifth; session 15 measured it 33.74 -> 31.78 us alone and no faster a step, on a step since changed
#     by many defaults. A/B/A/B at 8192 and 131072, 1 and 4 slots (same bits: G64 either way). Then the H100-chosen
#     defaults session 56 call C did not reach, against their switches on the H200: a single row's routed-expert
#     shapes by card and last wave (session 48, `TILERT_GPU_EXPERT_SHAPE=30`: session 30's shapes), the pipelined
#     step's copies off the main stream (session 45, `TILERT_GPU_AHEAD_COPY=0`), the raised priority past 32768 keys
#     (session 44, `TILERT_GPU_MAIN_PRIO=1` at 131072) and the short scores on wgh2 (session 43, `IDX_WGH=2short`).
#     Then block clocks on both models at 8192 (`TILERT_GPU_BLOCK_CLOCKS=1`, traced): no H200 has taken them; the
#     H100s' (session 52) say where the grouped input GEMV's and the one-block top-k's time goes. Last, 1 and 4 slots
#     with `--same-rows` (session 56: the rows hit the same experts, the weights read once), both models.
NAME=s56
. docs/measured/next/plan.sh "$1"
DSQ=TILERT_GPU_TILE_PLANS=24576x1536=G32/R8_st/B0
GLQ=TILERT_GPU_TILE_PLANS=16384x2048=G32/R8_st/B0
qst8() {
  abab deepseek-v3.2 8192 1 qd8 $DSQ; abab glm-5 8192 1 qg8 $GLQ
  grep -h "TILERT_GPU_TILE_PLANS\|staged" $R/qd8-B.txt $R/qg8-B.txt | head -6 >> $R/summary.txt; save
}
qst131() { abab deepseek-v3.2 131072 1 qd131 $DSQ; abab glm-5 131072 1 qg131 $GLQ; }
checks() {
  export TILERT_GPU_REPORT=$R/report.txt TILERT_ENGINE_REPORT=$R/engine-report.txt
  tst kernels cuda/kernels 150 'TestKernelMLATCStaging|TestKernelGemm|TestKernelGemvStage|TestKernelAbsorb|TestPDL|TestKernelMLATCF' &
  tst engine engine/gpu 150 '^TestGPU(GreedyMatchesCPU|Prefill|FastPrefill|WqbStage)' & wait
  for f in kernels engine; do cnt $f; done; save
}
case "$PART" in
a)
  if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then
    JS=1 bn deepseek-v3.2 8192,131072 1 ds1
    JS=1 bn glm-5 8192,131072 1 glm1
    qst8
  else
    qst8; checks; qst131
  fi ;;
o)
  OP=TILERT_GPU_OPROJ=G64/R8_d16s/B0
  abab deepseek-v3.2 8192 1 op-ds $OP; abab deepseek-v3.2 131072 1 op-ds131 $OP; save
  abab deepseek-v3.2 8192 4 op-ds4 $OP; save ;;  # the rest of this part moved to s57.sh o (session 57)
*) echo "usage: s56.sh a|o" >&2; exit 2 ;;
esac
