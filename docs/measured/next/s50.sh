# Session 50's device plan (issue 10). Usage: bash docs/measured/next/s50.sh ep   (binaries in .device/next)
#  ep (~7 min, any card; kernels.test, engine.test, tilert): TILERT_GPU_EPI_PRE=1 (kernels.EpiloguePre, built this
#    session): the one-row scaled attention epilogue on attn_epilogue_qsp, whose position, RoPE entries and norm
#    weights load before its PDL wait and whose other loads go out together after it. TestKernelEpiloguePre (bit for
#    bit attn_epilogue_qs, launched programmatically behind the launch that writes its inputs), TestKernelQANormLate and
#    TestPDLKernelsWait beside the engine checks it touches with it on (GreedyMatchesCPU, QANormLate,
#    SideStreamSameTokens); then A/B/A/B at 1 slot on GLM-5 dims 8192 and 131072 (the indexer chain is their critical
#    path) and DeepSeek-V3.2 dims 8192; then one traced GLM-5 dims step each way (the epilogue's charged time).
#  Then s49.sh's queue: c49 (gpu-check's first half, the whole-chunks A/B) on any card, h4 on an H200.
NAME=s50
. docs/measured/next/plan.sh "$1"
case "$PART" in
ep)
  tst kernels cuda/kernels 200 '^TestKernel(EpiloguePre|QANormLate)$|^TestPDLKernelsWait$' &
  TILERT_GPU_EPI_PRE=1 tst engine engine/gpu 300 '^TestGPU(GreedyMatchesCPU|QANormLate|SideStreamSameTokens)$'; wait
  cnt kernels; cnt engine; grep -h -E "attn_epilogue_qsp" $R/kernels.log | head -12 >> $R/summary.txt; save
  abab glm-5 8192 1 eg8 TILERT_GPU_EPI_PRE=1
  abab glm-5 131072 1 eg131 TILERT_GPU_EPI_PRE=1
  abab deepseek-v3.2 8192 1 ed8 TILERT_GPU_EPI_PRE=1
  TL=1 bn glm-5 8192 1 tl-A; TL=1 bn glm-5 8192 1 tl-B TILERT_GPU_EPI_PRE=1
  for f in tl-A tl-B; do echo "== $f" >> $R/summary.txt; grep -E "layers \(each|gemv_group_r8_m1_qw$|attn_epilogue|indexer_scores|topk_radix|absorb_q|mla_decode" $R/$f.txt | head -12 >> $R/summary.txt; done
  xz -T4 $R/tl-*.json 2>/dev/null; save ;;
*) echo "usage: s50.sh ep" >&2; exit 2 ;;
esac
