# pfill2 submission 2 (<= 90 s): mla_prefill_tcp/tcpi (new) vs float64 and timed beside mla_decode_tc/tcp;
# issue 10's prefill command on the new defaults (GEMMs, absorb_tc, one 8192-row chunk, tcpi); engine checks on them.
set -x; cd .device/pfill2 && gunzip -f *.gz && chmod +x * && cd ../.. ; mkdir -p $RES
D=$PWD/.device/pfill2
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv > $RES/smi.txt 2>&1
date +%s > $RES/t0
# 1. compile + kernel checks of the prefill MLA kernels (float64 reference, fresh random inputs; tcpi == tcp bitwise) + timing
(cd cuda/kernels && TILERT_GPU_TIMING=1 TILERT_GPU_REPORT=$RES/kcheck-report.txt timeout 50 $D/kernels.test -test.run 'TestKernelMLAPrefill$|TestKernelTimingMLAPrefill$' -test.v -test.count=1 > $RES/kcheck.log 2>&1); date +%s >> $RES/t0
grep -E 'mla_|FAIL' $RES/kcheck-report.txt | head -20; grep -E 'us ' $RES/kcheck.log | head
# 2. issue 10's prefill command on the defaults (no env), per-op profile
timeout 30 $D/tilert bench decode --dummy-weights deepseek-v3.2 --layers 1 --prompt-len 8192 --tokens 4 --prefill-lens 1024,8192 --profile --json $RES/prefill-default.json 2>&1 | tee $RES/prefill-default.txt; date +%s >> $RES/t0
# 3. engine checks on the defaults
(cd engine/gpu && TILERT_ENGINE_REPORT=$RES/engine-report.txt timeout 45 $D/engine.test -test.run 'TestGPUCachesMatchCPU$|TestGPUPrefillGemm|TestGPUGreedyMatchesCPU$|TestGPUGoldenExact$|TestGPUMLAPrefillRouted$|TestGPUPenaltiesMatchCPU$' -test.v -test.count=1 > $RES/engine-test.log 2>&1; echo rc=$? >> $RES/engine-test.log); date +%s >> $RES/t0
grep -E '^(--- |ok|FAIL|rc=)' $RES/engine-test.log
