# Session 59's device plan (issue 10). Usage: bash docs/measured/next/s59.sh k   (binaries in .device/next: tilert,
# kernels.test, engine.test)
#  k: o_proj's one row as split-K slices on the routed down's shape (TILERT_GPU_OPROJ_SPLIT=1,
#     gemv_tile_fp8_r8_m1_o4k, summed by the post-attention norm's launch). Session 56's H200 trace had o_proj at 34.0
#     us against 27.8 of bytes (its busiest SM 64 rows against a mean of 54), the routed down of the same bytes near the
#     copy rate. Checks first (TestKernelGemvSplitK: each slice bit for bit the down's launch over the slices as
#     experts, the sum against float64; TestGPUOprojSplit: DeepSeek-V3.2 dims' logits one row a forward; and the routing
#     probe session 58 built, never run on a GPU), then A/B/A/B at 1 slot: both models at 8192, DeepSeek-V3.2 dims at
#     131072, the split launched plainly once, a traced step with it and without; then the README's rows on main.
NAME=s59
. docs/measured/next/plan.sh "$1"
case "$PART" in
k)
  export TILERT_GPU_REPORT=$R/report.txt TILERT_ENGINE_REPORT=$R/engine-report.txt
  tst kernels cuda/kernels 150 'TestKernelGemvSplitK|TestPDL' &
  tst engine engine/gpu 300 '^TestGPU(OprojSplit|RoutingProbe)$' & wait
  for f in kernels engine; do cnt $f; done; save
  if grep -q -- '--- FAIL' $R/kernels.log $R/engine.log; then echo "split checks FAIL: no step runs" >> $R/summary.txt; save; exit 0; fi
  SP=TILERT_GPU_OPROJ_SPLIT=1
  abab deepseek-v3.2 8192 1 k-ds $SP
  abab glm-5 8192 1 k-glm $SP; save
  bn deepseek-v3.2 8192 1 k-ds-plain $SP TILERT_GPU_PDL_PLAIN=gemv_tile_fp8_r8_m1_o4k
  abab deepseek-v3.2 131072 1 k-ds131 $SP; save
  TL=1 bn deepseek-v3.2 8192 1 k-tl-ds $SP; TL=1 bn deepseek-v3.2 8192 1 k-tl-ds0; xz -T4 $R/k-tl-*.json 2>/dev/null; save
  # The README's rows on main as it is (s58.sh r's first lines; on an H200 the table).
  SAMP=--same-rows JS=1 bn deepseek-v3.2 8192 1,4 k-same-ds
  JS=1 bn deepseek-v3.2 8192,131072 1,4 k-rows-ds; JS=1 bn glm-5 8192,131072 1,4 k-rows-glm; save ;;
*) echo "usage: s59.sh k" >&2; exit 2 ;;
esac
