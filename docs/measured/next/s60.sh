# Session 60's device plan (issue 10). Usage: bash docs/measured/next/s60.sh q   (binaries in .device/next: tilert,
# kernels.test, engine.test)
#  q: q_b and the query absorption as one launch (TILERT_GPU_QB_ABSORB=1: a block a head; =2: a cluster of two blocks
#     a head; qb_absorb_g32_r4 / g64_r8). Session 56's H200 trace had the query's chain (q_b, absorb_q's 512 blocks)
#     end within 1 us of the indexer's, absorb_q's blocks beside the one-block top-k (8.8 us after the scores against
#     6.2 alone). Checks first (TestKernelQBAbsorb: q_b's row, the absorbed sums and the RoPE part bit for bit the two
#     launches'; TestGPUQBAbsorb: both models' dims, the logits bit for bit), then A/B/A/B at 1 slot: =1 on both models
#     at 8192, =2 on DeepSeek-V3.2 dims, =1 without the L2 prefetch, =1 launched programmatically, =1 at 131072; a
#     traced step with =1 and one without.
#  p: the A/B/A/Bs without the L2 prefetch (after call A), traced steps.
#  k: s59.sh k (o_proj's split-K slices, then the README's rows on main) on this call's binaries.
NAME=s60
. docs/measured/next/plan.sh "$1"
case "$PART" in
q)
  export TILERT_GPU_REPORT=$R/report.txt TILERT_ENGINE_REPORT=$R/engine-report.txt
  tst kernels cuda/kernels 150 'TestKernelQBAbsorb|TestKernelAbsorbFast|TestPDL' &
  tst engine engine/gpu 300 '^TestGPUQBAbsorb$' & wait
  for f in kernels engine; do cnt $f; done; save
  if grep -q -- '--- FAIL' $R/kernels.log $R/engine.log; then echo "qb_absorb checks FAIL: no step runs" >> $R/summary.txt; save; exit 0; fi
  Q=TILERT_GPU_QB_ABSORB
  abab deepseek-v3.2 8192 1 q-ds $Q=1
  abab glm-5 8192 1 q-glm $Q=1; save
  abab deepseek-v3.2 8192 1 q2-ds $Q=2; save
  bn deepseek-v3.2 8192 1 q-ds-nopf $Q=1 TILERT_GPU_QB_ABSORB_PF=0
  bn deepseek-v3.2 8192 1 q-ds-pdl $Q=1 TILERT_GPU_PDL_MORE=mla_decode_tcf,gemv_mid,absorb_v,mla_decode_wg2b,mla_decode_wg2h,indexer_scores_wgh,qb_absorb
  abab deepseek-v3.2 131072 1 q-ds131 $Q=1; save
  TL=1 bn deepseek-v3.2 8192 1 q-tl-ds $Q=1; TL=1 bn deepseek-v3.2 8192 1 q-tl-ds0; xz -T4 $R/q-tl-*.json 2>/dev/null; save ;;
p)
  # After call A (the prefetch lost there): the same A/B/A/Bs without it, and traced steps.
  Q=TILERT_GPU_QB_ABSORB; NP=TILERT_GPU_QB_ABSORB_PF=0
  abab deepseek-v3.2 8192 1 p-ds $Q=1 $NP
  abab glm-5 8192 1 p2-glm $Q=2 $NP
  abab deepseek-v3.2 131072 1 p-ds131 $Q=1 $NP
  bn glm-5 8192 1 p1-glm $Q=1 $NP
  bn deepseek-v3.2 8192 1 p2-ds $Q=2 $NP
  TL=1 bn deepseek-v3.2 8192 1 p-tl-ds $Q=1 $NP; TL=1 bn glm-5 8192 1 p-tl-glm $Q=2 $NP; TL=1 bn glm-5 8192 1 p-tl-glm0
  xz -T4 $R/p-tl-*.json; save ;;
k)
  exec bash docs/measured/next/s59.sh k ;;
d) ;;
*) echo "usage: s60.sh q|p|k|d" >&2; exit 2 ;;
esac
# d (after calls A-B): the default since call B (auto: one block a head where the heads give 3/4 of the SMs a block,
# rows within 32768 keys, no prefetch) against TILERT_GPU_QB_ABSORB=0, with the checks again.
if [ "$PART" = d ]; then
  tst kernels cuda/kernels 150 'TestKernelQBAbsorb' &
  tst engine engine/gpu 300 '^TestGPUQBAbsorb$' & wait
  for f in kernels engine; do cnt $f; done; save
  Q0=TILERT_GPU_QB_ABSORB=0
  abab deepseek-v3.2 8192 1 d-ds $Q0
  abab glm-5 8192 1 d-glm $Q0
  abab deepseek-v3.2 131072 1 d-ds131 $Q0; save
  JS=1 bn deepseek-v3.2 8192,131072 1,4 d-rows-ds; JS=1 bn glm-5 8192,131072 1,4 d-rows-glm; save
fi
