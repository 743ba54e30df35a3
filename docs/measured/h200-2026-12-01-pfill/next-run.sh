# Not run: the plan for the next session with a device (<= 120 s on one H200). It checks the kernels
# written after round 1 against float64 references on fresh random inputs (fp16-part FP8 GEMM with 2/3
# parts and 64/128-row blocks, grouped experts, absorb_tc q/v), times prefill at 1024 and 8192 with the
# per-op profile (round-1 configuration, then the new opt-in kernels with 2048-row chunks), runs the engine
# checks with all of it on (the default-on decision), and times the kernels against the old ones.
# Usage as .device/pfill/run.sh (see /work/TEAM.md), binaries built from the pfill branch.
set -x; cd .device/pfill && gunzip -f *.gz && chmod +x * && cd ../.. ; mkdir -p $RES
D=$PWD/.device/pfill
NEW="TILERT_GPU_GEMM=1 TILERT_GPU_GEMM_H2=1 TILERT_GPU_ABSORB_TC=1 TILERT_GPU_PREFILL_CHUNK=2048"
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv > $RES/smi.txt 2>&1
# 1. compile + the new kernel checks vs float64 references
(cd cuda/kernels && TILERT_GPU_REPORT=$RES/kcheck-report.txt timeout 75 $D/kernels.test -test.run 'TestKernelGemmH2$|TestKernelGemmExpertsH2$|TestKernelAbsorbTC$' -test.v -test.count=1 > $RES/kcheck.log 2>&1)
# 2. prefill 1024 / 8192 with the profile: the new opt-in kernels, 2048-row chunks
env $NEW timeout 40 $D/tilert bench decode --dummy-weights deepseek-v3.2 --layers 1 --prompt-len 8192 --tokens 4 --prefill-lens 1024,8192 --profile --json $RES/prefill-new.json 2>&1 | tee $RES/prefill-new.txt
# 3. engine checks with all of it on
(cd engine/gpu && env $NEW TILERT_ENGINE_REPORT=$RES/engine-report.txt timeout 45 $D/engine.test -test.run 'TestGPUPrefillGemm|TestGPUCachesMatchCPU|TestGPUGreedyMatchesCPU$|TestGPUGoldenExact$|TestGPUPenaltiesMatchCPU|TestGPUProfilePrefill|TestGPUShardGreedy$' -test.v -test.count=1 > $RES/engine-test.log 2>&1; echo rc=$? >> $RES/engine-test.log)
grep -E '^(--- |ok|FAIL)' $RES/engine-test.log | tail -20; grep -c PASS $RES/kcheck-report.txt; grep FAIL $RES/kcheck-report.txt | head
# 4. kernel timing: fp16-part GEMM (b64/b128, 2/3 parts) vs gemm_fp8_tc at M=2048; absorb_tc vs absorb_*_fp8
(cd cuda/kernels && TILERT_GPU_TIMING=1 timeout 20 $D/kernels.test -test.run 'TestKernelGemmH2Timing$' -test.v -test.count=1 > $RES/ktiming.log 2>&1)
# 5. round-1 configuration in the same run (baseline), then 2 fp16 parts and MLA tc32
TILERT_GPU_GEMM=1 timeout 25 $D/tilert bench decode --dummy-weights deepseek-v3.2 --layers 1 --prompt-len 8192 --tokens 4 --prefill-lens 1024,8192 --json $RES/prefill-round1.json 2>&1 | tee $RES/prefill-round1.txt
env $NEW TILERT_GPU_GEMM_H2_PARTS=2 TILERT_GPU_MLA_TC32=1 timeout 25 $D/tilert bench decode --dummy-weights deepseek-v3.2 --layers 1 --prompt-len 8192 --tokens 4 --prefill-lens 1024,8192 --profile --json $RES/prefill-p2-tc32.json 2>&1 | tee $RES/prefill-p2-tc32.txt
