# NOT RUN: the round-2 plan for a session with a device (the 20:09 UTC batch was refused: no machine lent).
# Checks gemv_mma_x.cu (second iteration: hi/lo accumulators, _p, cp.async _a, grouped attention inputs),
# the bitwise equality of every variant within a generation, the graph-timed sweep of both generations
# at M = 1, 2, 4, 8, the engine with each generation on every shape, and the step at 4 slots and with MTP
# with the default (gemv_mma.cu), =0 (tile kernels) and =x (second iteration). Run from the repo root with
# binaries built into .device/mrows/ as TEAM.md says; ~150 s.
set -x; cd .device/mrows && gunzip -f *.gz && chmod +x * && cd ../.. ; mkdir -p $RES
D=$PWD/.device/mrows
(cd cuda/kernels && TILERT_GPU_REPORT=$RES/check-report.txt $D/kernels.test -test.v -test.count=1 -test.run 'TestKernelGemvMMA$|TestKernelGemvGroupMMA|TestKernelMMAVariantsBitwise|TestMMAShape|TestGemvMMALayout|TestGemvMMAChunkWalk|TestPDLKernelsWait' > $RES/check.log 2>&1; echo "rc=$?" >> $RES/check.log)
grep -c PASS $RES/check-report.txt; grep FAIL $RES/check-report.txt | head
(cd cuda/kernels && TILERT_GPU_TIMING=1 TILERT_GPU_REPORT=$RES/timing-report.txt timeout 60 $D/kernels.test -test.v -test.count=1 -test.run 'TestKernelMMATiming' > $RES/timing.log 2>&1; echo "rc=$?" >> $RES/timing.log)
grep "mma sweep" $RES/timing.log | cut -c1-600
for m in all xall; do (cd engine/gpu && TILERT_GPU_GEMV_MMA=$m timeout 60 $D/engine.test -test.v -test.count=1 -test.run '^TestGPU(GreedyMatchesCPU|CachesMatchCPU|LogitsMatchEmulator|PenaltiesMatchCPU|ForcedDrafts|GraphsEqualEager)$' > $RES/engine-$m.log 2>&1; echo "rc=$?" >> $RES/engine-$m.log); done
for m in 1 0 x; do
  TILERT_GPU_GEMV_MMA=$m timeout 60 $D/tilert bench decode --device cuda --dummy-weights deepseek-v3.2 --layers 9 --context 8192 --batches 1,4 --profile --json $RES/bench-$m.json > $RES/bench-$m.txt 2>&1
  TILERT_GPU_GEMV_MMA=$m timeout 40 $D/tilert bench decode --device cuda --dummy-weights deepseek-v3.2 --layers 9 --context 8192 --batches 1 --mtp --json $RES/bench-mtp-$m.json > $RES/bench-mtp-$m.txt 2>&1
done
