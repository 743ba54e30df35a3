# Session 50's device plan (issue 10). Usage: bash docs/measured/next/s50.sh ep|v   (binaries in .device/next)
#  ep (~2 min, any card; kernels.test, engine.test, tilert of 3a8fbb2; ran as call A: no gain, both switches removed
#    and refused now, the code last in 3a8fbb2, so this part is the record and stops at the refusal): TILERT_GPU_EPI_PRE=1 (kernels.EpiloguePre, built this
#    session): the one-row scaled attention epilogue on attn_epilogue_qsp, whose position, RoPE entries and norm
#    weights load before its PDL wait and whose other loads go out together after it. TestKernelEpiloguePre (bit for
#    bit attn_epilogue_qs, launched programmatically behind the launch that writes its inputs), TestKernelQANormLate and
#    TestPDLKernelsWait beside the engine checks it touches with it on (GreedyMatchesCPU, QANormLate,
#    SideStreamSameTokens); then A/B/A/B at 1 slot on GLM-5 dims 8192 and 131072 (the indexer chain is their critical
#    path) and DeepSeek-V3.2 dims 8192; then one traced GLM-5 dims step each way (the epilogue's charged time).
#    TILERT_GPU_SCORES_PRE=1 (kernels.ScoresPre, built this session): the two-warpgroup indexer scores on
#    indexer_scores_wgh2p, each warpgroup's first page of keys loaded before its PDL wait where the epilogue before it
#    cannot have written it (TestKernelScoresPre: bit for bit wgh2, behind a copy that writes the newest key's page).
#    Both are A/B/A/B'd alone on GLM-5 dims 8192 and together on GLM-5 dims 131072 and DeepSeek-V3.2 dims 8192.
#  v (~8 min, any card; kernels.test, decode.test, cuda.test, cupti.test, tilert): the grouped GEMV on the separate
#    launch's G (groupShape through tileLaunchShape: call B's gpu-check half found TestKernelGemvGroup failing at K =
#    1536 since session 49's whole chunks), its checks and the tile ones, then check2 (gpu-check's second half), then
#    the README's 1-slot rows (JSON).
#  Then s49.sh's queue: c49 (gpu-check's first half, the whole-chunks A/B) on any card, h4 on an H200.
NAME=s50
. docs/measured/next/plan.sh "$1"
case "$PART" in
ep)
  export TILERT_GPU_REPORT=$R/report.txt
  tst kernels cuda/kernels 200 '^TestKernel(EpiloguePre|ScoresPre|QANormLate|IndexerWGH)$|^TestPDL' &
  TILERT_GPU_EPI_PRE=1 TILERT_GPU_SCORES_PRE=1 tst engine engine/gpu 300 '^TestGPU(GreedyMatchesCPU|QANormLate|SideStreamSameTokens)$'; wait
  cnt kernels; cnt engine; grep -h -E "qsp|wgh2p" $R/report.txt | head -24 >> $R/summary.txt; save
  B="TILERT_GPU_EPI_PRE=1 TILERT_GPU_SCORES_PRE=1"
  abab glm-5 8192 1 eg8 TILERT_GPU_EPI_PRE=1
  abab glm-5 8192 1 sg8 TILERT_GPU_SCORES_PRE=1
  abab glm-5 131072 1 bg131 $B
  abab deepseek-v3.2 8192 1 bd8 $B
  TL=1 bn glm-5 8192 1 tl-A; TL=1 bn glm-5 8192 1 tl-B $B
  for f in tl-A tl-B; do echo "== $f" >> $R/summary.txt; grep -E "layers \(each|gemv_group_r8_m1_qw$|attn_epilogue|indexer_scores|topk_radix|absorb_q|mla_decode" $R/$f.txt | head -12 >> $R/summary.txt; done
  xz -T4 $R/tl-*.json 2>/dev/null; save ;;
v)
  export TILERT_GPU_REPORT=$R/report.txt
  tst kernels cuda/kernels 200 '^TestKernel(GemvGroup|GemvGroupMid|QANormLate|GemvTile)$'
  cnt kernels; grep -h -E "gemv_group K=1536" $R/report.txt | head -8 >> $R/summary.txt; save
  check2
  JS=1 bn deepseek-v3.2 8192,131072 1 r1-ds; JS=1 bn glm-5 8192,131072 1 r1-glm ;;
*) echo "usage: s50.sh ep|v" >&2; exit 2 ;;
esac
