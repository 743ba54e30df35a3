# Round 1 as run on the H200 (binaries from commit 3d07bc6's tree, i.e. branch mrows at 19:46 UTC; reconstructed from console.txt's trace)
set -x; cd .device/mrows && gunzip -f *.gz && chmod +x * && cd ../.. ; mkdir -p $RES
D=$PWD/.device/mrows
(cd cuda/kernels && TILERT_GPU_REPORT=$RES/check-report.txt $D/kernels.test -test.v -test.count=1 -test.run 'TestKernelGemvMMA$|TestMMAShape|TestGemvMMALayout|TestPDLKernelsWait' > $RES/check.log 2>&1; echo "rc=$?" >> $RES/check.log)
(cd cuda/kernels && TILERT_GPU_TIMING=1 TILERT_GPU_REPORT=$RES/timing-report.txt timeout 40 $D/kernels.test -test.v -test.count=1 -test.run 'TestKernelMMATiming' > $RES/timing.log 2>&1; echo "rc=$?" >> $RES/timing.log)
(cd engine/gpu && TILERT_GPU_GEMV_MMA=all timeout 45 $D/engine.test -test.v -test.count=1 -test.run '^TestGPU(GreedyMatchesCPU|CachesMatchCPU|LogitsMatchEmulator|PenaltiesMatchCPU|ForcedDrafts|GraphsEqualEager)$' > $RES/engine-mma.log 2>&1; echo "rc=$?" >> $RES/engine-mma.log)
TILERT_GPU_GEMV_MMA=1 timeout 45 $D/tilert bench decode --device cuda --dummy-weights deepseek-v3.2 --layers 9 --context 8192 --batches 4 --json $RES/bench-mma-b4.json > $RES/bench-mma-b4.txt 2>&1
