set -x; cd .device/experts && gunzip -f *.gz && chmod +x * && cd ../.. ; mkdir -p $RES
D=$PWD/.device/experts
# 1. compile warm-up + check: every variant / capped grid == the plain kernel bit for bit (fresh random experts)
(cd cuda/kernels && timeout 75 $D/kernels.test -test.v -test.count=1 -test.run 'TestKernelTileVariantsBitwise|TestTileShape' 2>&1 > $RES/kernels-bitwise.log; tail -3 $RES/kernels-bitwise.log; grep -c PASS $RES/kernels-bitwise.log; grep FAIL $RES/kernels-bitwise.log | head)
# 2. timing table (rules 1/2/3) + sweeps G x R x variant x blocks/SM (experts M=1,4; dense shapes)
(cd cuda/kernels && TILERT_GPU_TIMING=1 timeout 25 $D/kernels.test -test.v -test.count=1 -test.run 'TestKernelTileTiming' 2>&1 > $RES/kernels-timing.log; grep -E "GB/s" $RES/kernels-timing.log | cut -c1-170 | head -90)
# 3. engine checks whose numbers the rule moves (default = rule 3)
(cd engine/gpu && timeout 25 $D/engine.test -test.v -test.count=1 -test.run 'TestGPUPenaltiesMatchCPU|TestGPULogitsMatchEmulator|TestGPUCachesMatchCPU' 2>&1 > $RES/engine.log; grep -E "PASS|FAIL" $RES/engine.log | tail -30)
# 4. step with rule 3 (rule 1 = main's kernels: docs/measured/h200-2026-12-01-merged)
timeout 40 $D/tilert bench decode --device cuda --dummy-weights deepseek-v3.2 --layers 9 --context 8192 --batches 1 --profile --json $RES/bench-tile3.json > $RES/bench-tile3.txt 2>&1; head -40 $RES/bench-tile3.txt
