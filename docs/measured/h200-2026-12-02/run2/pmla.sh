# pmla (issue 10): mla_prefill_h1, the sparse MLA prefill with one fp16 part (TILERT_GPU_MLA_PREFILL=4).
# Fragment: $D holds kernels.test, engine.test, decode.test and tilert built from branch pmla; $R the results.
# ~100 s expected, 150 s at most (the timeouts). Run from the repo root.
P="TILERT_GPU_GEMM=1 TILERT_GPU_ABSORB_TC=1 TILERT_GPU_MLA_PREFILL=4"
export TILERT_KERNEL_CACHE=${TILERT_KERNEL_CACHE:-/tmp/tilert-kernels}
mkdir -p $R
# 1. kernel check vs the CPU references (float64 on exact inputs with the one-part bound, float64 on the kernel's
#    rounded inputs, lse; -1 padded, past-length, empty and full rows; 4 / 72 / 128 heads; paged cache; repeat == bits)
(cd cuda/kernels && TILERT_GPU_REPORT=$R/pmla-kernels-report.txt timeout 25 $D/kernels.test -test.count=1 -test.v \
  -test.run 'TestKernelMLAPrefillH1$' > $R/pmla-kernels.log 2>&1; echo rc=$? >> $R/pmla-kernels.log)
# 2. timing: mla_prefill_tcp (=2) and mla_prefill_h1 (=4) at 256 rows x 128 heads x top-k 2048 of 8192, h1 at 1024 rows,
#    beside a device-to-device copy
(cd cuda/kernels && TILERT_GPU_TIMING=1 TILERT_GPU_REPORT=$R/pmla-kernels-timing.txt timeout 25 $D/kernels.test -test.count=1 \
  -test.v -test.run 'TestKernelTimingMLAPrefillH1$' > $R/pmla-kernels-timing.log 2>&1; echo rc=$? >> $R/pmla-kernels-timing.log)
# 3. engine checks with the switches on: greedy == emulator in the same mode (batched, MTP), prefill caches vs the
#    emulator and vs CPU (<= 10% of bytes: see engine/gpu/mla_prefill_test.go), mlaPrefill routed, exact mode never calls it
#    (~20 s of it is the emulator on the host CPU)
(cd engine/gpu && env $P TILERT_ENGINE_REPORT=$R/pmla-engine-report.txt timeout 70 $D/engine.test -test.count=1 -test.v \
  -test.run 'TestGPUMLAPrefillH1$' > $R/pmla-engine.log 2>&1; echo rc=$? >> $R/pmla-engine.log)
# 4. the 8192-token prefill (issue 10; HF bf16: 141 ms; main with MLA_PREFILL=2: 440 ms, 174 ms of it MLA)
env $P timeout 30 $D/tilert bench decode --device cuda --dummy-weights deepseek-v3.2 --layers 1 --prompt-len 8192 --tokens 4 \
  --prefill-lens 1024,8192 --profile --json $R/pmla-prefill.json > $R/pmla-prefill.txt 2>&1; echo rc=$? >> $R/pmla-prefill.txt
