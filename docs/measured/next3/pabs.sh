# Fragment of helper pabs (branch pabs), issue 10: the one-part absorbs (absorb_p1, gemm_p1_absorb.cu) that
# TILERT_GPU_GEMM_SPLITS=1 now brings with it, and the engine checks of every one-part prefill switch together.
# Needs $D (kernels.test, engine.test, decode.test, tilert built from the branch) and $R (results dir); run from
# the repo root. Whole fragment <= 150 s: each step's timeout is the smaller of its own cap and what is left of
# 150 s; steps in order of importance. The first kernel step pays the NVRTC compile on a fresh device (~50 s;
# TILERT_KERNEL_CACHE is shared by the steps).
export TILERT_KERNEL_CACHE=${TILERT_KERNEL_CACHE:-/tmp/tilert-kernels}
pa_t0=$SECONDS
pa_left() { local l=$((150 - (SECONDS - pa_t0))); [ $l -lt 1 ] && l=1; [ $l -lt $1 ] && echo $l || echo $1; }
mkdir -p $R/pabs
P1="TILERT_GPU_GEMM=1 TILERT_GPU_ABSORB_TC=1 TILERT_GPU_MLA_PREFILL=4 TILERT_GPU_GEMM_SPLITS=1"
# 1. kernel checks: absorb_p1 q and v modes vs float64 on fresh random inputs, every output within its derived
#    one-part bound, and vs the host transcription of its rounding (what the engine's emulator does) within
#    float32 summation noise; tails (rows, nope 192, vd 48 / 256), padded / unaligned strides, rows 2^+-40 apart.
#    Then the timing at the 8192-token DeepSeek-V3.2 shapes against absorb_tc (3 parts) next to a d2d copy.
(cd cuda/kernels && TILERT_GPU_TIMING=1 TILERT_GPU_REPORT=$R/pabs/kernels-report.txt timeout $(pa_left 80) $D/kernels.test \
  -test.count=1 -test.v -test.run 'TestAbsorbP1BoundFails$|TestAbsorbP1Transcribed$|TestKernelAbsorbP1$|TestKernelAbsorbP1Timing$' \
  > $R/pabs/kernels.log 2>&1; echo rc=$? >> $R/pabs/kernels.log)
# 2. the 8192-token prefill with every one-part switch (issue 10: HF 141 ms; run 2 of 2026-12-02: 184.8 ms with
#    absorbQ + absorbV 22.5 ms on absorb_tc; target here <= 8 ms for the two layers' absorbs)
env $P1 timeout $(pa_left 30) $D/tilert bench decode --device cuda --dummy-weights deepseek-v3.2 --layers 1 --prompt-len 8192 \
  --tokens 4 --prefill-lens 1024,8192 --profile --json $R/pabs-prefill.json > $R/pabs/prefill.txt 2>&1
echo rc=$? >> $R/pabs/prefill.txt
# 3. engine checks with all one-part switches on. 3a, the combination (TestGPUPrefillOnePartAll: GPU vs the
#    emulated one-part forward with the same roundings, caches value by value and teacher-forced logits against
#    float32-noise baselines; GPU vs CPU within 1.5x of the emulated roundings' own effect; layer 0 <= 0.2%).
(cd engine/gpu && env $P1 TILERT_ENGINE_REPORT=$R/pabs/engine-all-report.txt timeout $(pa_left 50) $D/engine.test -test.count=1 -test.v \
  -test.run 'TestGPUPrefillOnePartAll$|TestAbsorbP1Routed$' > $R/pabs/engine-all.log 2>&1; echo rc=$? >> $R/pabs/engine-all.log)
# 3b. each switch's own checks under the same environment (they pin the other switch: GEMMs + absorbs with the
#    MLA prefill off; mla_prefill_h1 with 3-part GEMMs), exact mode keeping 3 parts and its HF goldens.
(cd engine/gpu && env $P1 TILERT_ENGINE_REPORT=$R/pabs/engine-report.txt timeout $(pa_left 60) $D/engine.test -test.count=1 -test.v \
  -test.run 'TestGPUPrefillGemmP1Caches$|TestGPUPrefillGemmP1Logits$|TestGPUMLAPrefillH1$|TestGemmPartsExactMode$|TestGPUPrefillGemmGoldenExact$' \
  > $R/pabs/engine.log 2>&1; echo rc=$? >> $R/pabs/engine.log)
