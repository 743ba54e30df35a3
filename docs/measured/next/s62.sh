# Session 62's device plan (issue 10). Usage: bash docs/measured/next/s62.sh a|h
# Binaries: .device/next (tilert, kernels.test[, engine.test]) built from this commit; .device/old's tilert from
# 0fe7709 (session 61's main). Both changes are bit for bit the kernels they replace; the marks tell them apart:
#  - indexer_scores_wgh*: the query's codes and head weights loaded before the lens -> page -> keys chain (the
#    "query staged" mark sat 2.1-2.7 us after release, H100, session 61 call D);
#  - topk_radix_one_w*: the emit staged in shared memory and copied out coalesced ("emit counted" to "stored" 1.6 us);
#  - (qb_absorb's batched W_UK loads and early RoPE entries were reverted after call A: TestKernelQBAbsorb failed on
#    the rotation's bits; TestKernelQBAbsorb stays in the checks as qb_absorb's regression test);
#  - attn_epilogue's block 0 (latent row, indexer key): the rows loaded with the position, the table entries before
#    the norms (marks "kv / key in / normed / stored").
#  a: the kernels' checks (TestKernelIndexerWGH, TestKernelTopKOneW, TestKernelTopKRadix, TestKernelQBAbsorb,
#     TestGPUBlockMarks), then
#     A/B/A/B at 1 slot (A 0fe7709, B this commit; BIN=new labels B) on GLM-5 dims (the top-k ends the front) and
#     DeepSeek-V3.2 dims at 8192, GLM-5 dims at 131072 (the long scores take the query change only), then traced
#     steps with block clocks and marks on both models at 8192.
#     Then TILERT_GPU_MLA_SPLITS=16 A/B/A/B on this binary (mla_decode_wg2's 32 one-tile ranges write 8 MB of
#     float32 partials a layer that the combine reads back; 16 ranges of two tiles halve them).
#     Then TILERT_GPU_POST_NORM=cl A/B/A/B (the post-attention add + RMSNorm on the 8-block cluster launch, o_proj's
#     row its one slot; add_rmsnorm_reg's one block ran 2.6 us after release, session 61 call D).
#  h: on an H200: the table on this commit (both models, 8192 and 131072, 1 and 4 slots, JSON), the
#     4-slot same-row rows, the MTP row, the split-K check no H200 has run, then part a's A/Bs.
NAME=s62
. docs/measured/next/plan.sh "$1"
DN=$D; DO=$PWD/.device/old
if ls .device/old/*.xz >/dev/null 2>&1; then (cd .device/old && for f in *.xz; do xz -d -f "$f"; done); fi
chmod +x .device/old/* 2>/dev/null
abb() { local m=$1 c=$2 n=$3; D=$DO bn $m $c 1 $n-A; D=$DN bn $m $c 1 $n-B BIN=new; D=$DO bn $m $c 1 $n-A2; D=$DN bn $m $c 1 $n-B2 BIN=new; }
checks() {
  tst kernels cuda/kernels 200 "${1}TestKernelIndexerWGH\$|TestKernelTopKOneW|TestKernelTopKRadix|TestKernelQBAbsorb|TestKernelFusedAttnEpilogue|TestGPUBlockMarks"; cnt kernels; save
  if grep -q -- '--- FAIL' $R/kernels.log; then echo "checks FAIL: no step runs" >> $R/summary.txt; save; exit 0; fi
}
ab() {
  abb glm-5 8192 a-glm; abb deepseek-v3.2 8192 a-ds; save
  D=$DN TL=1 bn glm-5 8192 1 a-tl-glmc TILERT_GPU_BLOCK_CLOCKS=1; D=$DN TL=1 bn deepseek-v3.2 8192 1 a-tl-dsc TILERT_GPU_BLOCK_CLOCKS=1
  xz -T4 $R/*-tl-*.json 2>/dev/null; save
  D=$DN abab deepseek-v3.2 8192 1 a-pn-ds TILERT_GPU_POST_NORM=cl; D=$DN abab glm-5 8192 1 a-pn-glm TILERT_GPU_POST_NORM=cl; save
  D=$DN abab deepseek-v3.2 8192 1 a-sp-ds TILERT_GPU_MLA_SPLITS=16; save
  abb glm-5 131072 a-glm131; D=$DN abab glm-5 8192 1 a-sp-glm TILERT_GPU_MLA_SPLITS=16; save
}
case "$PART" in
a) checks; ab ;;
b)
  # Part a's first half for a short budget: the checks, the A/B/A/Bs at 8192 and the traced steps.
  checks; abb glm-5 8192 a-glm; abb deepseek-v3.2 8192 a-ds; save
  D=$DN TL=1 bn glm-5 8192 1 a-tl-glmc TILERT_GPU_BLOCK_CLOCKS=1; D=$DN TL=1 bn deepseek-v3.2 8192 1 a-tl-dsc TILERT_GPU_BLOCK_CLOCKS=1
  xz -T4 $R/*-tl-*.json 2>/dev/null; save
  # GLM-5 dims' qb_absorb in clusters of two (auto declines there: +3 / +3 us on an H100 in session 60, before this
  # session's batched W_UK loads and early RoPE entries).
  D=$DN abab glm-5 8192 1 a-qb2-glm TILERT_GPU_QB_ABSORB=2; save ;;
h)
  JS=1 bn deepseek-v3.2 8192,131072 1,4 h-rows-ds; JS=1 bn glm-5 8192,131072 1,4 h-rows-glm; save
  SAMP=--same-rows JS=1 bn deepseek-v3.2 8192 1,4 h-same-ds; MTP=1 bn deepseek-v3.2 8192 1 h-mtp-ds; save
  checks 'TestKernelGemvSplitK|'
  if [ -x $D/engine.test ]; then tst engine engine/gpu 150 '^TestGPU(QBAbsorb|OprojSplit|RoutingProbe)$'; cnt engine; save; fi
  ab ;;
*) echo "usage: s62.sh a|b|h" >&2; exit 2 ;;
esac
