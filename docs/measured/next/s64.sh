# Session 64's device plan (issue 10). Usage: bash docs/measured/next/s64.sh a|h
# Binaries: .device/next (tilert, engine.test, kernels.test) built from this commit; the device command starts
# `rm -rf .device/next && cp -r .device/c65 .device/next`, carry [".device/c65"].
# New this session: TILERT_GPU_SIDE_PDL=q (side.go sidePDLMode): the q chain's side launches programmatic, the shared
# expert's plain. Session 63 call B's block clocks (DeepSeek-V3.2 dims, 8192, H100): qb_absorb, the fork's first
# launch, plain, became resident 4.0 us after the grouped input GEMV's last block left (16.5 against 12.5 us into the
# layer), the wq_b GEMV launched programmatically behind it on the main stream 0.9 us after, and the HBM idled
# between. Session 17 measured every side launch programmatic (=1) +31..+51 us a step: the shared expert's down held
# registers resident behind its gate/up; =q leaves that chain plain. Expected on DeepSeek-V3.2 dims: qb_absorb's q_b
# streams ~2-3 us earlier, the front ends at the top-k (~1.4 us later than qb_absorb today): ~-1..-2 us a layer.
# GLM-5 dims' q chain is q_b then absorb_q_fast: =q makes absorb_q_fast resident behind q_b (the risk session 13 saw).
# And TILERT_GPU_QB_ONE=1 (kernels.QBAbsorbArgs.OneBarrier, the _1 forms): qb_absorb's four absorbed column blocks
# into four shared buffers and one barrier instead of two a column block (session 63: the absorption took 5.5 us
# after q_b even with W_UK in shared memory, its reductions and barriers); the same bits (TestKernelQBAbsorb,
# TestGPUQBAbsorb), 128 registers, 18 KB of shared memory (NVRTC 12.9: no spills). DeepSeek-V3.2 dims only (the
# dims where qb_absorb runs by default). Expected ~1-2 us a layer off qb_absorb; the front then ends at the top-k.
#  a: the side stream's GPU checks (cap and plain holds scoped to the fork, the same tokens with =q) and QB_ONE's
#     (kernel and engine, bit for bit), then A/B/A/B at 8192, 1 slot: SIDE_PDL=q on both models, =1 once on
#     DeepSeek-V3.2 dims, QB_ONE=1 and both together on DeepSeek-V3.2 dims, and traced steps with block clocks.
#  e: TILERT_GPU_SIDE_EDGE=1 (binaries .device/c66: tilert, engine.test, cuda.test): TestProgrammaticDeps (the
#     mechanism on a two-stream graph), A/B/A/B on both models at 8192, a traced step, the same tokens. NOT RUN in
#     session 64 (its device time ran out).
#  x: one call on whichever card comes: part a's checks and A/B/A/Bs (the table first on an H200).
#  h: on an H200: the table on this commit (both models, 8192 and 131072, 1 and 4 slots, JSON), then part a's
#     A/B/A/Bs, and the spread o_proj's (session 56's trace: o_proj 6 us a layer over its bytes there).
NAME=s64
. docs/measured/next/plan.sh "$1"
ab() {
  abab deepseek-v3.2 8192 1 $1-q-ds TILERT_GPU_SIDE_PDL=q; save
  if ! grep -q -- '--- FAIL' $R/kernels.log; then
    abab deepseek-v3.2 8192 1 $1-one-ds TILERT_GPU_QB_ONE=1; save
    abab deepseek-v3.2 8192 1 $1-both-ds TILERT_GPU_QB_ONE=1 TILERT_GPU_SIDE_PDL=q; save
  else echo "QB_ONE checks FAIL: no rows" >> $R/summary.txt; fi
  abab glm-5 8192 1 $1-q-glm TILERT_GPU_SIDE_PDL=q; save
  bn deepseek-v3.2 8192 1 $1-all-ds TILERT_GPU_SIDE_PDL=1; save
  TL=1 bn deepseek-v3.2 8192 1 $1-tl-both-ds TILERT_GPU_BLOCK_CLOCKS=1 TILERT_GPU_SIDE_PDL=q TILERT_GPU_QB_ONE=1
  TL=1 bn deepseek-v3.2 8192 1 $1-tl-ds TILERT_GPU_BLOCK_CLOCKS=1
  xz -T4 $R/*-tl-*.json 2>/dev/null; save
}
kchk() { tst kernels cuda/kernels 150 'TestKernelQBAbsorb$'; cnt kernels; save; }
chk() {
  tst engine engine/gpu 280 'TestGPUSideCapScoped|TestGPUSideStreamSameTokens|TestGPUGreedyMatchesCPU|TestGPUQBAbsorb'; cnt engine; save
}
case "$PART" in
a) kchk; ab a; chk ;;
x)
  # One call on whichever card comes (short budget): the checks, the A/B/A/Bs, the traces; on an H200 the issue's
  # table first.
  if [ -z "$BANK" ]; then JS=1 bn deepseek-v3.2 8192,131072 1,4 x-rows-ds; JS=1 bn glm-5 8192,131072 1,4 x-rows-glm; save; fi
  kchk; ab x
  tst engine engine/gpu 200 'TestGPUSideCapScoped|TestGPUQBAbsorb|TestGPUSideStreamSameTokens'; cnt engine; save ;;
h)
  JS=1 bn deepseek-v3.2 8192,131072 1,4 h-rows-ds; JS=1 bn glm-5 8192,131072 1,4 h-rows-glm; save
  kchk; ab h
  abab deepseek-v3.2 8192 1 h-op-ds TILERT_GPU_OPROJ=G64/R8_d16s/B0; save
  chk ;;
e)
  tst cuda cuda 60 'TestProgrammaticDeps|TestGraphEdge'; cnt cuda; save
  abab deepseek-v3.2 8192 1 e-edge-ds TILERT_GPU_SIDE_EDGE=1; save
  TL=1 bn deepseek-v3.2 8192 1 e-tl-edge-ds TILERT_GPU_BLOCK_CLOCKS=1 TILERT_GPU_SIDE_EDGE=1; xz -T4 $R/*-tl-*.json 2>/dev/null; save
  tst engine engine/gpu 150 'TestGPUSideStreamSameTokens'; cnt engine; save
  abab glm-5 8192 1 e-edge-glm TILERT_GPU_SIDE_EDGE=1; save ;;
*) echo "usage: s64.sh a|h|x|e" >&2; exit 2 ;;
esac
