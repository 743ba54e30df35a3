# Session 8, call 4: helper pwg2's wgmma MLA prefill with a producer warpgroup (=6, never run on a GPU), helper
# pgap's prefill host gap (counting sort, shared expert under the host's ordering; the wall/device clock line),
# the cuda binding's device tests (Do after a Goexit), the wg checks without their old opt-in, and the default
# prefill path's engine checks after pgap's reordering. Build from main (repo root), as
# docs/measured/next/run.sh's header says, plus `go test -c -o .device/next/cuda.test ./cuda`; carry .device/next.
set -x
cd .device/next && gunzip -f *.gz; chmod +x *; cd ../..
D=$PWD/.device/next
R=/tmp/next5; rm -rf $R; mkdir -p $R   # the device keeps /tmp between sessions: start empty
export TILERT_KERNEL_CACHE=/tmp/tilert-kernels
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv > $R/smi.txt 2>&1
(cd cuda && timeout 60 $D/cuda.test -test.v -test.count=1 > $R/cuda-test.log 2>&1; echo rc=$? >> $R/cuda-test.log)
(cd cuda/kernels && TILERT_GPU_REPORT=$R/wg-kernels-report.txt timeout 90 $D/kernels.test -test.count=1 -test.v \
  -test.run 'TestKernelWGMMAProbe$|TestKernelMLAPrefillWG$' > $R/wg-kernels.log 2>&1; echo rc=$? >> $R/wg-kernels.log)
tar czf $OUT/s1.tgz -C $R .
source docs/measured/next5/pwg2.sh
tar czf $OUT/s2.tgz -C $R .
source docs/measured/next5/pgap.sh
tar czf $OUT/s3.tgz -C $R .
(cd engine/gpu && TILERT_ENGINE_REPORT=$R/default-engine-report.txt timeout 120 $D/engine.test -test.count=1 -test.v \
  -test.run '^(TestGPUGreedyMatchesCPU|TestGPUCachesMatchCPU|TestGPUGolden|TestGPUGoldenExact|TestGPUPrefillGemmGreedy|TestGPUPrefillGemmCaches|TestGPUPrefillGemmGoldenExact|TestGPUMLAPrefillGreedy|TestGPULogitsMatchEmulator|TestGPUShardGreedy|TestGPUTrained|TestGPUPenaltiesMatchCPU)$' \
  > $R/default-engine.log 2>&1; echo rc=$? >> $R/default-engine.log)
tar czf $OUT/s4.tgz -C $R .
for f in $R/*.log $R/*/*.log; do echo "$f: $(grep -c '^--- PASS' $f) PASS $(grep -c '^--- FAIL' $f) FAIL $(grep -c '^--- SKIP' $f) SKIP $(tail -1 $f)"; done
