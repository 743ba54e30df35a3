# Session 63's device plan (issue 10). Usage: bash docs/measured/next/s63.sh a|b|c|h
# Binaries: .device/next (tilert, kernels.test) built from this commit (session 63 left them in .device/c63, built
# from 790e201: the device command starts `rm -rf .device/next && cp -r .device/c63 .device/next`, carry
# [".device/c63", ".device/old"]);
# .device/old's tilert from 0fe7709 (session 61's main: the A of session 62's A/B/A/Bs, which only GLM-5 dims at
# 8192 ran).
# New this session (no device): TILERT_GPU_QB_STAGE=1|2 (kernels.QBStage). qb_absorb's W_UK rows after q_b are four
# dependent round trips a block today (one a 128-column block); =1 copies the head's slice (64 KB + its scales) into
# shared memory by cp.async as the block starts, =2 asks for all four column blocks in one round trip. Both load the
# RoPE entries before q_b and so build every module with TILERT_ROPE_RN (the query rotation rounded product by
# product in absorb_q_fp8 / absorb_q_fast / qb_absorb): their checks must pass with the switch set first.
# And TILERT_GPU_MLA_CLUSTER=1 (kernels.MLACluster): the one-tile decode MLA (mla_decode_wg2b / wg2h) in clusters of 8
# ranges that merge their float32 partials through distributed shared memory, one partial a cluster (1 MB a layer
# instead of 8 at one row of 128 heads), the combine reading 4 a head instead of 32; not the plain form's bits
# (another order of the merge): TestKernelMLADecodeWG2C holds it to 2^-18 of the plain form and to float64's bound.
#  a: the checks of session 62's kernels, TestKernelMLADecodeWG2C, and both QB_STAGE builds' (bit for bit: qb_absorb
#     == absorb_q_fast == absorb_q_fp8, RoPE part included), then A/B/A/B at 8192: MLA_CLUSTER=1 on DeepSeek-V3.2 dims,
#     QB_STAGE=1 and =2 on DeepSeek-V3.2 dims (the only dims where qb_absorb runs by default), MLA_CLUSTER=1 on GLM-5
#     dims.
#  b: 0fe7709 against this commit on DeepSeek-V3.2 dims at 8192 and GLM-5 dims at 131072 (session 62's three
#     changes), traced steps with block clocks on both models, then session 62's two switches:
#     TILERT_GPU_POST_NORM=cl and TILERT_GPU_MLA_SPLITS=16, then DeepSeek-V3.2 dims' o_proj on the spread plan
#     (TILERT_GPU_OPROJ=G64/R8_d16s/B0: the busiest SM 56 of 7168 rows instead of 64; s56.sh o, never run: session
#     56's H200 trace put o_proj at 34.0 us against 27.8 of bytes).
#  c: part a for a short budget: the checks, then MLA_CLUSTER=1 and QB_STAGE=1 on DeepSeek-V3.2 dims at 8192.
#  h: on an H200: the table on this commit (both models, 8192 and 131072, 1 and 4 slots, JSON), the 4-slot
#     same-row rows, then the spread o_proj's A/B/A/B (where it was measured: 6 us a layer over its bytes).
# Parts a-c ran on an H100 in session 63 (docs/measured/h100-2026-12-07-s63); the four switches they set were removed
# after (refused since), so only part h runs on today's main.
NAME=s63
. docs/measured/next/plan.sh "$1"
DN=$D; DO=$PWD/.device/old
if ls .device/old/*.xz >/dev/null 2>&1; then (cd .device/old && for f in *.xz; do xz -d -f "$f"; done); fi
chmod +x .device/old/* 2>/dev/null
abb() { local m=$1 c=$2 n=$3; D=$DO bn $m $c 1 $n-A; D=$DN bn $m $c 1 $n-B BIN=new; D=$DO bn $m $c 1 $n-A2; D=$DN bn $m $c 1 $n-B2 BIN=new; }
# tsq V: the absorb checks with TILERT_GPU_QB_STAGE=V (kernels.TestMain reads it) into kernels-qsV.log.
tsq() {
  (cd cuda/kernels && TILERT_GPU_QB_STAGE=$1 timeout 200 $D/kernels.test -test.v -test.count=1 -test.timeout=190s \
    -test.run 'TestKernelQBAbsorb$|TestKernelAbsorbFast$|TestKernelAbsorbFP8$|TestKernelQANormLate$' > $R/kernels-qs$1.log 2>&1
    echo "rc=$?" >> $R/kernels-qs$1.log)
  cnt kernels-qs$1; grep -c "qb_absorb_g32_r4_n\?_[sb] " $R/kernels-qs$1.log | sed "s|^|staged-form rows qs$1: |" >> $R/summary.txt
}
checks() {
  tst kernels cuda/kernels 200 "TestKernelIndexerWGH\$|TestKernelTopKOneW|TestKernelTopKRadix|TestKernelQBAbsorb|TestKernelFusedAttnEpilogue|TestKernelMLADecodeWG2C"; cnt kernels; save
  tsq 1; tsq 2; save
  # A failed check of the default kernels stops the plan; the opt-ins' own checks drop only their rows.
  if grep -- '--- FAIL' $R/kernels.log | grep -v -q TestKernelMLADecodeWG2C; then echo "checks FAIL: no step runs" >> $R/summary.txt; save; exit 0; fi
}
qs() {
  # A failed QB_STAGE check drops that switch's rows (its bits are not the default's).
  for v in 1 2; do
    if grep -q -- '--- FAIL' $R/kernels-qs$v.log; then echo "QB_STAGE=$v checks FAIL: no rows" >> $R/summary.txt; continue; fi
    D=$DN abab deepseek-v3.2 8192 1 a-qs$v-ds TILERT_GPU_QB_STAGE=$v; save
  done
}
cl() {
  if grep -q -- '--- FAIL: TestKernelMLADecodeWG2C' $R/kernels.log; then echo "MLA_CLUSTER checks FAIL: no rows" >> $R/summary.txt; return; fi
  D=$DN abab $1 8192 1 a-cl-$2 TILERT_GPU_MLA_CLUSTER=1; save
}
case "$PART" in
a) checks; cl deepseek-v3.2 ds; qs; cl glm-5 glm ;;
c)
  checks; cl deepseek-v3.2 ds
  if ! grep -q -- '--- FAIL' $R/kernels-qs1.log; then D=$DN abab deepseek-v3.2 8192 1 a-qs1-ds TILERT_GPU_QB_STAGE=1; save; fi ;;
b)
  abb deepseek-v3.2 8192 b-ds; abb glm-5 131072 b-glm131; save
  D=$DN TL=1 bn glm-5 8192 1 b-tl-glmc TILERT_GPU_BLOCK_CLOCKS=1; D=$DN TL=1 bn deepseek-v3.2 8192 1 b-tl-dsc TILERT_GPU_BLOCK_CLOCKS=1
  xz -T4 $R/*-tl-*.json 2>/dev/null; save
  D=$DN abab deepseek-v3.2 8192 1 b-pn-ds TILERT_GPU_POST_NORM=cl; save
  D=$DN abab deepseek-v3.2 8192 1 b-sp-ds TILERT_GPU_MLA_SPLITS=16; save
  D=$DN abab deepseek-v3.2 8192 1 b-op-ds TILERT_GPU_OPROJ=G64/R8_d16s/B0; save ;;
h)
  JS=1 bn deepseek-v3.2 8192,131072 1,4 h-rows-ds; JS=1 bn glm-5 8192,131072 1,4 h-rows-glm; save
  SAMP=--same-rows JS=1 bn deepseek-v3.2 8192 1,4 h-same-ds; save
  D=$DN abab deepseek-v3.2 8192 1 h-op-ds TILERT_GPU_OPROJ=G64/R8_d16s/B0; save ;;
*) echo "usage: s63.sh a|b|c|h" >&2; exit 2 ;;
esac
