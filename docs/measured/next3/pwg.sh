# Fragment of helper pwg (branch pwg), issue 10: mla_prefill_wg (cu/wg/mla_prefill_wg.cu), mla_prefill_h1's
# function and roundings on Hopper's wgmma, its own sm_90a module, opt-in TILERT_GPU_MLA_PREFILL=5.
# Needs $D (kernels.test, engine.test, decode.test, tilert built from the branch) and $R (results dir); run from
# the repo root. Whole fragment <= 120 s: each step's timeout is the smaller of its own cap and what is left of
# 120 s; steps in order of importance. A cold NVRTC cache costs the first kernel step ~50 s (the main module;
# the sm_90a module is one kernel, ~1-2 s); TILERT_KERNEL_CACHE is shared by the steps.
export TILERT_KERNEL_CACHE=${TILERT_KERNEL_CACHE:-/tmp/tilert-kernels}
export TILERT_GPU_WG_CHECK=1 # the wg checks are opt-in until this fragment has run
pw_t0=$SECONDS
pw_left() { local l=$((120 - (SECONDS - pw_t0))); [ $l -lt 1 ] && l=1; [ $l -lt $1 ] && echo $l || echo $1; }
mkdir -p $R/pwg
WG="TILERT_GPU_GEMM_SPLITS=1 TILERT_GPU_MLA_PREFILL=5"
# 1. kernel: the sm_90a module compiles with the device's NVRTC (ptxas -v: registers, spills in the log); the
#    pure-Go transcription (wgmma descriptor / fragment model); the hardware probe of the kernel's two wgmma
#    descriptor conventions alone (exact sums; if P.V's fails it logs whether LBO/SBO swapped is right); the GPU check vs the float64 references on exact
#    and kernel-rounded inputs (h1's one-part bounds), vs mla_prefill_h1 on the same inputs (<= 2^-10 max|v|),
#    repeated launch bit-identical, bad arguments refused; shapes 37x72 / 24x4 / 9x128 paged / 6x128 top-k 2048.
#    Then the timing at issue 10's shape (128 heads, top-k 2048 of 8192; 256 and 1024 rows) beside mla_prefill_h1
#    and a d2d copy. Expect: every row PASS; wg faster than h1's ~26.8 ms / 8192 rows (~155 TFLOP/s).
(cd cuda/kernels && TILERT_GPU_TIMING=1 TILERT_GPU_REPORT=$R/pwg/kernels-report.txt timeout $(pw_left 60) $D/kernels.test \
  -test.count=1 -test.v -test.run 'TestNVRTCCompilesWGModule$|TestMLAPrefillWGTranscribed$|TestKernelWGMMAProbe$|TestKernelMLAPrefillWG$|TestKernelTimingMLAPrefillWG$' \
  > $R/pwg/kernels.log 2>&1; echo rc=$? >> $R/pwg/kernels.log)
# 2. the 8192-token prefill with every one-part switch and mla_prefill_wg (HF 141 ms; =4 in s7 run 3: 157.7 ms, of
#    which mlaPrefill 53.7 ms for 2 layers). The log says once whether =5 ran mla_prefill_wg or fell back to =4.
env $WG timeout $(pw_left 25) $D/tilert bench decode --device cuda --dummy-weights deepseek-v3.2 --layers 1 --prompt-len 8192 \
  --tokens 4 --prefill-lens 1024,8192 --profile --json $R/pwg-prefill.json > $R/pwg/prefill.txt 2>&1
echo rc=$? >> $R/pwg/prefill.txt
# 3. engine checks with =5 (they fail if mla_prefill_wg did not run: counted): TestGPUMLAPrefillWG is
#    TestGPUMLAPrefillH1's (greedy and caches vs the emulated one-part forward, caches vs CPU, routing, exact mode
#    never runs it; GEMMs pinned to 3 parts); TestGPUPrefillOnePartAllWG is TestGPUPrefillOnePartAll's (every
#    one-part switch together, bounds for all roundings) with =5.
(cd engine/gpu && env $WG TILERT_ENGINE_REPORT=$R/pwg/engine-report.txt timeout $(pw_left 35) $D/engine.test -test.count=1 -test.v \
  -test.run 'TestGPUPrefillOnePartAllWG$|TestGPUMLAPrefillWG$' > $R/pwg/engine.log 2>&1; echo rc=$? >> $R/pwg/engine.log)
