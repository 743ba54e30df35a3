set -x; cd .device/mrows && gunzip -f *.gz && chmod +x * && cd ../.. ; mkdir -p $RES
D=$PWD/.device/mrows
# 1. tensor-core GEMV vs float64 reference (every M 1..8 auto, every variant at M=2,7, grouped); first run compiles the module
(cd cuda/kernels && TILERT_GPU_REPORT=$RES/check-report.txt $D/kernels.test -test.v -test.count=1 -test.run 'TestKernelGemvMMA$|TestKernelGemvGroupMMA|TestMMAShape|TestGemvMMALayout|TestGemvMMAChunkWalk|TestPDLKernelsWait' > $RES/check.log 2>&1; echo "rc=$?" >> $RES/check.log)
tail -2 $RES/check.log; grep -c PASS $RES/check-report.txt; grep FAIL $RES/check-report.txt | head
# 2. graph timing tile vs mma, M=1,2,4,8, variant sweep (incl. _a cp.async, _p), grouped attention inputs
(cd cuda/kernels && TILERT_GPU_TIMING=1 TILERT_GPU_REPORT=$RES/timing-report.txt timeout 30 $D/kernels.test -test.v -test.count=1 -test.run 'TestKernelMMATiming' > $RES/timing.log 2>&1; echo "rc=$?" >> $RES/timing.log)
grep "mma sweep" $RES/timing.log | cut -c1-400
# 3. MTP 1 slot (2 rows through every layer), MMA default (baseline 5.606 ms, merged2)
timeout 40 $D/tilert bench decode --device cuda --dummy-weights deepseek-v3.2 --layers 9 --context 8192 --batches 1 --mtp --json $RES/bench-mtp.json > $RES/bench-mtp.txt 2>&1; echo "rc=$?" >> $RES/bench-mtp.txt
cat $RES/bench-mtp.txt
# 4. 4 slots, MMA default (run 1: 8.000 ms; merged2 9.163)
if [ $SECONDS -lt 58 ]; then timeout $((88 - SECONDS)) $D/tilert bench decode --device cuda --dummy-weights deepseek-v3.2 --layers 9 --context 8192 --batches 4 --json $RES/bench-b4.json > $RES/bench-b4.txt 2>&1; echo "rc=$?" >> $RES/bench-b4.txt; cat $RES/bench-b4.txt; fi
# 5. engine checks with the MMA GEMVs on every shape, if time is left
if [ $SECONDS -lt 74 ]; then (cd engine/gpu && TILERT_GPU_GEMV_MMA=all timeout $((88 - SECONDS)) $D/engine.test -test.v -test.count=1 -test.run '^TestGPU(GreedyMatchesCPU|LogitsMatchEmulator|CachesMatchCPU)$' > $RES/engine-mma.log 2>&1; echo "rc=$?" >> $RES/engine-mma.log); grep -E "^(--- |ok|FAIL)|rc=" $RES/engine-mma.log; fi
echo "total ${SECONDS}s"
