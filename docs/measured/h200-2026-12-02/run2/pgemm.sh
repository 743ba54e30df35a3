# Plan fragment of helper pgemm (branch pgemm): the one-part serving prefill
# (TILERT_GPU_GEMM_SPLITS=1, issue 10: an 8192-token prefill at least as fast as HF's 141 ms).
# Needs $D (kernels.test, engine.test, decode.test, tilert built from the branch) and $R (results dir);
# run from the repo root. Steps share TILERT_KERNEL_CACHE, so only the first pays the NVRTC compile
# (~50 s on a fresh device). Whole fragment <= 150 s: each step's timeout is the smaller of its own cap
# and what is left of 150 s (steps in order of importance: kernels, bench, engine checks, baseline bench).
export TILERT_KERNEL_CACHE=${TILERT_KERNEL_CACHE:-/tmp/tilert-kernels}
pg_t0=$SECONDS
pg_left() { local l=$((150 - (SECONDS - pg_t0))); [ $l -lt 1 ] && l=1; [ $l -lt $1 ] && echo $l || echo $1; }
mkdir -p $R/pgemm
# 1. kernel checks (gemm_p1 fp16 one-part, gemm_fp8/bf16/experts_tc_s1) vs float64 on fresh random inputs,
#    each output within its own one-part bound (gemm_p1_test.go derives it); then the timings at the
#    8192-token shapes next to the 3-part kernel and a 1 GiB device-to-device copy.
(cd cuda/kernels && TILERT_GPU_TIMING=1 TILERT_GPU_REPORT=$R/pgemm/kernels-report.txt timeout $(pg_left 80) $D/kernels.test \
  -test.count=1 -test.v -test.run 'TestGemmP1Permutation$|TestOnePartBoundFits$|TestKernelGemmP1$|TestKernelGemmExpertsP1$|TestKernelGemmP1Timing$' \
  > $R/pgemm/kernels.log 2>&1; echo rc=$? >> $R/pgemm/kernels.log)
# 2. the prefill bench with one part (the headline: gemmFP8 18432x7168x8192 target <= 8 ms, was 23.6)
P="TILERT_GPU_GEMM=1 TILERT_GPU_ABSORB_TC=1 TILERT_GPU_MLA_PREFILL=2"
env $P TILERT_GPU_GEMM_SPLITS=1 timeout $(pg_left 30) $D/tilert bench decode --device cuda --dummy-weights deepseek-v3.2 \
  --layers 1 --prompt-len 8192 --tokens 4 --prefill-lens 1024,8192 --profile --json $R/pgemm/prefill-splits1.json \
  > $R/pgemm/prefill-splits1.txt 2>&1; echo rc=$? >> $R/pgemm/prefill-splits1.txt
# 3. engine checks with the switch on (serving: greedy == CPU on GEMV-length prompts, caches value by value
#    vs CPU against the 2^-11 noise baseline, teacher-forced logits vs the CPU float32 forward and vs the
#    emulated one-part forward; exact mode keeps 3 parts: its HF goldens with the switch at 1)
(cd engine/gpu && env TILERT_GPU_GEMM=1 TILERT_GPU_GEMM_SPLITS=1 TILERT_ENGINE_REPORT=$R/pgemm/engine-report.txt \
  timeout $(pg_left 60) $D/engine.test -test.count=1 -test.v \
  -test.run 'TestGPUPrefillGemmP1Greedy$|TestGPUPrefillGemmP1Caches$|TestGPUPrefillGemmP1Logits$|TestGPUPrefillGemmGoldenExact$|TestGemmPartsExactMode$|TestForwardParts$' \
  > $R/pgemm/engine.log 2>&1; echo rc=$? >> $R/pgemm/engine.log)
# 4. the same bench with today's 3 parts (the baseline in the same run: 440 ms at 8192 last time)
env $P timeout $(pg_left 30) $D/tilert bench decode --device cuda --dummy-weights deepseek-v3.2 \
  --layers 1 --prompt-len 8192 --tokens 4 --prefill-lens 1024,8192 --profile --json $R/pgemm/prefill-splits3.json \
  > $R/pgemm/prefill-splits3.txt 2>&1; echo rc=$? >> $R/pgemm/prefill-splits3.txt
