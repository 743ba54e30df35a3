# Session 64's device plan (issue 10). Usage: bash docs/measured/next/s64.sh e|h
# Binaries: .device/c66 (tilert, engine.test, cuda.test of main after session 64); the device command starts
# `rm -rf .device/next && cp -r .device/c66 .device/next`, carry [".device/c66"].
# Call A (part x, one H100, docs/measured/h100-2026-12-08-s64) measured TILERT_GPU_SIDE_PDL=q and TILERT_GPU_QB_ONE=1
# from 9e8e7e0's binaries (.device/c65): both were removed and are refused since; the part is gone from this plan
# (its text: `git show 4bab9b7:docs/measured/next/s64.sh`).
# Built after call A, not yet run: TILERT_GPU_SIDE_EDGE=1 (side.go sideEdgeOn): a one-row step's q chain forks on a
# programmatic graph edge from the grouped input GEMV (cuda.Ctx.ProgrammaticDeps through
# cuStreamUpdateCaptureDependencies_v2), so that qb_absorb (DeepSeek-V3.2 dims) or q_b (GLM-5 dims) may become
# resident while the GEMV's last blocks run instead of ~4 us after (call A's trace: resident 16.4 us into the layer,
# the GEMV's last block out at 12.6). Expected: DeepSeek-V3.2 dims ~-1.5 us a layer (the front then ends at the top-k,
# 1.6 us before qb_absorb today); GLM-5 dims little (its front ends at the top-k already).
#  e: TestProgrammaticDeps (the mechanism on a two-stream graph) and TestGraphEdgeDataLayout, A/B/A/B on DeepSeek-V3.2
#     dims at 8192, a traced step with block clocks, TestGPUSideStreamSameTokens (the same tokens with the edge, some
#     edge turned), then A/B/A/B on GLM-5 dims.
#  h: on an H200: the table on this commit (both models, 8192 and 131072, 1 and 4 slots, JSON), part e, and
#     the spread o_proj's A/B/A/B (session 56's H200 trace: o_proj 6 us a layer over its bytes there; +12 / +11 on
#     an H100 in session 63).
NAME=s64
. docs/measured/next/plan.sh "$1"
e() {
  tst cuda cuda 60 'TestProgrammaticDeps|TestGraphEdge'; cnt cuda; save
  abab deepseek-v3.2 8192 1 $1-edge-ds TILERT_GPU_SIDE_EDGE=1; save
  TL=1 bn deepseek-v3.2 8192 1 $1-tl-edge-ds TILERT_GPU_BLOCK_CLOCKS=1 TILERT_GPU_SIDE_EDGE=1; xz -T4 $R/*-tl-*.json 2>/dev/null; save
  tst engine engine/gpu 150 'TestGPUSideStreamSameTokens'; cnt engine; save
  abab glm-5 8192 1 $1-edge-glm TILERT_GPU_SIDE_EDGE=1; save
}
case "$PART" in
e) e e ;;
h)
  JS=1 bn deepseek-v3.2 8192,131072 1,4 h-rows-ds; JS=1 bn glm-5 8192,131072 1,4 h-rows-glm; save
  e h
  abab deepseek-v3.2 8192 1 h-op-ds TILERT_GPU_OPROJ=G64/R8_d16s/B0; save ;;
*) echo "usage: s64.sh e|h" >&2; exit 2 ;;
esac
