# Session 55's device plan (issue 10). Usage: bash docs/measured/next/s55.sh h|q|k   (binaries in .device/next)
#  h (tilert; decode.test, cuda.test, cupti.test): on an H200, s53.sh h5 (every README row and traced steps, then the
#    staged wq_b's A/B/A/Bs); on an H100, q below.
#  q (tilert): q_b on the staged GEMV (gemv_stage_fp8_r8_m1, the tile plan variant _st that wq_b runs by default
#    since session 53), pinned by TILERT_GPU_TILE_PLANS with no new code: A/B/A/B, 1 slot, both models, 8192 and
#    131072. Session 53 found the staged wq_b gaining from its blocks' one burst of loads beside q_b, not from the
#    overlap before its PDL wait; q_b (37.7 MB on DeepSeek-V3.2 dims, 33.6 on GLM-5 dims) streams beside the
#    indexer chain at ~1.5-1.9 TB/s.
#  k (kernels.test, engine.test): make gpu-check's first half after the fp16-part GEMMs' and mla_decode_tc32's removal
#    (session 55).
#  qk (tilert, kernels.test, engine.test): q, then the checks those removals touched (the kernels' GEMM, absorb, MLA
#    staging, staged GEMV and PDL tests; the engine's greedy == CPU and prefill checks), for a short budget.
#    Since session 56 GLM-5 dims' q_b stages 32-row blocks (two an SM), not 64 (kernels.stageRows).
# Session 56 ran q, qk and h as `s56.sh a` (docs/measured/h200-2026-12-07-s56: the staged q_b lost), whose functions
# they now call.
NAME=s55
case "$1" in
q | qk | h) exec bash docs/measured/next/s56.sh a ;;
esac
. docs/measured/next/plan.sh "$1"
case "$PART" in
k) check1 ;;
*) echo "usage: s55.sh h|q|k|qk" >&2; exit 2 ;;
esac
