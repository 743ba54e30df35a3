set -x; cd .device/pfill && gunzip -f *.gz && chmod +x * && cd ../.. ; mkdir -p $RES
D=$PWD/.device/pfill
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv > $RES/smi.txt 2>&1
# 1. compile warm-up + the tensor-core GEMM kernel checks vs CPU references (fresh random inputs; bf16 per-tile promotion never ran on a device yet)
(cd cuda/kernels && TILERT_GPU_REPORT=$RES/kgemm-report.txt timeout 70 $D/kernels.test -test.run 'TestKernelGemmTC$|TestKernelGemmExpertsTC$' -test.v -test.count=1 2>&1 | tail -40 > $RES/kgemm.log)
# 2. THE PROFILE: prefill of 8192 tokens, deepseek-v3.2 dims, 1 dense + 1 MoE layer (the deepseek-v3.2-moe preset's shape), tensor-core GEMMs, every call timed alone
TILERT_GPU_GEMM=1 timeout 60 $D/tilert bench decode --dummy-weights deepseek-v3.2 --layers 1 --prompt-len 8192 --tokens 4 --profile --json $RES/prefill-8192.json 2>&1 | tee $RES/prefill-8192.txt
# 3. plain prefill at 1024
TILERT_GPU_GEMM=1 timeout 30 $D/tilert bench decode --dummy-weights deepseek-v3.2 --layers 1 --prompt-len 1024 --tokens 4 --json $RES/prefill-1024.json 2>&1 | tee $RES/prefill-1024.txt
# 4. engine checks with the tensor-core prefill ON (default-on decision): greedy/caches/goldens/penalties + the new profile's equality check
(cd engine/gpu && TILERT_GPU_GEMM=1 TILERT_ENGINE_REPORT=$RES/engine-report.txt timeout 60 $D/engine.test -test.run 'TestGPUProfilePrefill|TestGPUPrefillGemm|TestGPUCachesMatchCPU|TestGPUGreedyMatchesCPU$|TestGPUGoldenExact|TestGPUPenaltiesMatchCPU|TestGPULogitsMatchEmulator' -test.v -test.count=1 > $RES/engine-test.log 2>&1; echo rc=$? >> $RES/engine-test.log)
grep -E '^(--- |ok|FAIL)' $RES/engine-test.log | tail -30
