# Session 8, call 5 (call 4, run.sh, was taken back by the device pool before it finished and returned nothing;
# 440 s of device time were left): the trimmed version. The cuda binding's device tests; pwg2's kernel check and
# timing; the 8192-token prefill with =6 and =5 (both print pgap's wall/device clock line); the default prefill
# path's engine checks after pgap's MoE reordering. Same build as run.sh (decode.test left out: 64 MiB carry).
set -x
cd .device/next && gunzip -f *.gz; chmod +x *; cd ../..
D=$PWD/.device/next
R=/tmp/next5; rm -rf $R; mkdir -p $R/pwg2 $R/pgap   # the device keeps /tmp between sessions: start empty
export TILERT_KERNEL_CACHE=/tmp/tilert-kernels
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv > $R/smi.txt 2>&1
(cd cuda && timeout 30 $D/cuda.test -test.v -test.count=1 > $R/cuda-test.log 2>&1; echo rc=$? >> $R/cuda-test.log)
(cd cuda/kernels && TILERT_GPU_TIMING=1 TILERT_GPU_REPORT=$R/pwg2/kernels-report.txt timeout 80 $D/kernels.test \
  -test.count=1 -test.v -test.run 'TestKernelMLAPrefillWG2$|TestKernelTimingMLAPrefillWG$' > $R/pwg2/kernels.log 2>&1; echo rc=$? >> $R/pwg2/kernels.log)
tar czf $OUT/s1.tgz -C $R .
i=0
for e in "TILERT_GPU_GEMM_SPLITS=1 TILERT_GPU_MLA_PREFILL=6" "TILERT_GPU_GEMM_SPLITS=1 TILERT_GPU_MLA_PREFILL=5"; do
  i=$((i+1)); echo "$e" > $R/pgap/prefill-$i.env
  env $e timeout 35 $D/tilert bench decode --device cuda --dummy-weights deepseek-v3.2 --layers 1 --prompt-len 8192 \
    --tokens 4 --prefill-lens 1024,8192 --profile --json $R/pgap/prefill-$i.json > $R/pgap/prefill-$i.txt 2>&1
  echo rc=$? >> $R/pgap/prefill-$i.txt
done
tar czf $OUT/s2.tgz -C $R .
(cd engine/gpu && TILERT_ENGINE_REPORT=$R/default-engine-report.txt timeout 60 $D/engine.test -test.count=1 -test.v \
  -test.run '^(TestGPUClockPrefill|TestGPUPrefillGemmCaches|TestGPUPrefillGemmGreedy|TestGPUGreedyMatchesCPU|TestGPUCachesMatchCPU)$' \
  > $R/default-engine.log 2>&1; echo rc=$? >> $R/default-engine.log)
tar czf $OUT/s3.tgz -C $R .
for f in $R/*.log $R/*/*.log; do echo "$f: $(grep -c '^--- PASS' $f) PASS $(grep -c '^--- FAIL' $f) FAIL $(grep -c '^--- SKIP' $f) SKIP $(tail -1 $f)"; done
