# Fragment of helper pwg2 (branch pwg2), issue 10: mla_prefill_wg2 (cu/wg/mla_prefill_wg2.cu, sm_90a module),
# mla_prefill_wg's block with a producer warpgroup (gather + fp8->fp16 into a second fp16 stage while the two
# consumer warpgroups run QK^T / softmax / P.V), opt-in TILERT_GPU_MLA_PREFILL=6 (serving mode; without sm_90a
# it runs =4 and says so once in the log).
# Needs $D (kernels.test, engine.test, decode.test, tilert built from the branch) and $R (results dir); run from
# the repo root. Whole fragment <= 150 s: each step's timeout is the smaller of its own cap and what is left of
# 150 s; steps in order of importance. A cold NVRTC cache costs the first kernel step ~50 s (the main module);
# TILERT_KERNEL_CACHE is shared by the steps. A hang of the new kernel (a handoff deadlock) shows as rc=124 of
# step 1 with the last RUN line in kernels.log; steps 2-3 then end at their own caps.
export TILERT_KERNEL_CACHE=${TILERT_KERNEL_CACHE:-/tmp/tilert-kernels}
p2_t0=$SECONDS
p2_left() { local l=$((150 - (SECONDS - p2_t0))); [ $l -lt 1 ] && l=1; [ $l -lt $1 ] && echo $l || echo $1; }
rm -rf $R/pwg2; mkdir -p $R/pwg2
WG2="TILERT_GPU_GEMM_SPLITS=1 TILERT_GPU_MLA_PREFILL=6"
WG1="TILERT_GPU_GEMM_SPLITS=1 TILERT_GPU_MLA_PREFILL=5"
# 1. kernel (cap 62 s): the sm_90a module compiles with the device's NVRTC (ptxas -v per function: wg2 168
#    registers at entry, setmaxnreg 120 producer / 192 consumers, no spills); the pure checks (consumers are wg's
#    code; the producer transcribed inside wg's transcription, bit-identical; the handoff model); the GPU check:
#    vs float64 and vs kernel-rounded inputs (h1's one-part bounds), vs mla_prefill_wg BIT FOR BIT (values
#    differing must be 0), vs mla_prefill_h1 (<= 2^-10 max|v|; differing bits logged, expect 0), 3 repeated
#    launches bit-identical, bad arguments refused; shapes 37x72 / 24x4 / 9x128 paged / 6x128 top-k 2048 /
#    16x128 with empty tiles between valid ones. Then the timing at 128 heads, top-k 2048 of 8192, 256 and 1024
#    rows: h1, wg, wg2 beside a d2d copy (s8: h1 950 / 3753 us, wg 793 / 3127 us). Expect wg2 ~1.75x wg (range
#    1.35-2x): ~1.8 ms at 1024 rows (1.6-2.3), ~0.45-0.6 ms at 256.
(cd cuda/kernels && TILERT_GPU_TIMING=1 TILERT_GPU_REPORT=$R/pwg2/kernels-report.txt timeout $(p2_left 62) $D/kernels.test \
  -test.count=1 -test.v -test.run 'TestNVRTCCompilesWGModule$|TestPtxasSpills$|TestMLAPrefillWG2ConsumersAreWG$|TestMLAPrefillWG2Transcribed$|TestMLAPrefillWG2Handoff$|TestKernelMLAPrefillWG2$|TestKernelTimingMLAPrefillWG$' \
  > $R/pwg2/kernels.log 2>&1; echo rc=$? >> $R/pwg2/kernels.log)
# 2. the 8192-token prefill, all one-part, =6 then =5 in the same run (s8 on e471b46: =5 145.45 ms, mlaPrefill
#    44.1 ms of 130.5 device; HF 141; this branch has main's host-gap work, pgap predicts =5 ~131-133 ms). The log's
#    first line says whether =6 ran mla_prefill_wg2 or fell back. Expect: mlaPrefill ~25 ms for the 2 calls (range
#    22-33) with =6 against ~44 with =5, the 8192 prefill ~19 ms (11-22) below =5's in the same run.
env $WG2 timeout $(p2_left 24) $D/tilert bench decode --device cuda --dummy-weights deepseek-v3.2 --layers 1 --prompt-len 8192 \
  --tokens 4 --prefill-lens 1024,8192 --profile --json $R/pwg2/prefill-wg2.json > $R/pwg2/prefill-wg2.txt 2>&1
echo rc=$? >> $R/pwg2/prefill-wg2.txt
env $WG1 timeout $(p2_left 24) $D/tilert bench decode --device cuda --dummy-weights deepseek-v3.2 --layers 1 --prompt-len 8192 \
  --tokens 4 --prefill-lens 1024,8192 --profile --json $R/pwg2/prefill-wg.json > $R/pwg2/prefill-wg.txt 2>&1
echo rc=$? >> $R/pwg2/prefill-wg.txt
# 3. engine checks with =6 (each fails if mla_prefill_wg2 did not run: counted on wg2Launches), as two calls
#    (go test runs a binary's tests in source order, not -run's): TestGPUPrefillOnePartAllWG2 (every one-part
#    switch together; s8's wg version 26.5 s) and the emulator's =6 as =4 (CPU); then TestGPUMLAPrefillWG2
#    (TestGPUMLAPrefillH1's checks; wg's took 70.5 s) with what is left of the 150 s: likely cut here (rc=124),
#    it belongs to the next whole gpu-check with =6.
(cd engine/gpu && env $WG2 TILERT_ENGINE_REPORT=$R/pwg2/engine-report.txt timeout $(p2_left 35) $D/engine.test -test.count=1 -test.v \
  -test.run 'TestGPUPrefillOnePartAllWG2$|TestEmuMLAPrefillWG2IsH1$' > $R/pwg2/engine.log 2>&1; echo rc=$? >> $R/pwg2/engine.log)
(cd engine/gpu && env $WG2 TILERT_ENGINE_REPORT=$R/pwg2/engine-report2.txt timeout $(p2_left 80) $D/engine.test -test.count=1 -test.v \
  -test.run 'TestGPUMLAPrefillWG2$' > $R/pwg2/engine2.log 2>&1; echo rc=$? >> $R/pwg2/engine2.log)
