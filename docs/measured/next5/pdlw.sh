# Fragment of helper pdlw (branch pdlw), issue 10: TILERT_GPU_PDL=2, programmatic launches of the
# TILERT_PDL_EARLY compile of the kernel module (short kernels trigger before their wait; the weight-streaming
# GEMVs load their first round of weights before it and trigger after their last weight loads).
# Needs $D (kernels.test, engine.test, tilert built from the branch) and $R (results dir); run from the repo
# root. Whole fragment <= 150 s: each step's timeout is the smaller of its own cap and what is left of 150 s;
# steps in order of importance. Cold NVRTC cache: the default module (~60 s) and the early one (~60 s) compile
# in step 1, the early one in the background beside the default one; later steps hit the cache
# (TILERT_KERNEL_CACHE, shared by the steps).
export TILERT_KERNEL_CACHE=${TILERT_KERNEL_CACHE:-/tmp/tilert-kernels}
pl_t0=$SECONDS
pl_left() { local l=$((150 - (SECONDS - pl_t0))); [ $l -lt 1 ] && l=1; [ $l -lt $1 ] && echo $l || echo $1; }
mkdir -p $R/pdlw
# 1. kernels. In the background (CPU only) the early module compiles into the cache; in front, the pure source
#    checks (the early prologues read only weights; PDL_WAIT_STREAM only where the body waits; the peeled
#    first rounds are the loops' arithmetic; planted bad prologues fail) and the device chain: rmsnorm ->
#    staged-norm group -> loop-norm group -> group -> tile + residual -> rmsnorm -> router (wide) -> moe_route
#    -> gate/up (routed + shared) -> down -> combine -> add_rmsnorm at 1, 2, 4 rows, and at 1 row with the
#    tile shapes _d16, _o4 and (default module) capped grids; default module plain vs early module
#    programmatic, eager and graph x3, poisoned buffers. Expect: every row PASS with 0 differing words; the
#    log's "early Set: mode 2, programmatic launches true".
(cd cuda/kernels && unset TILERT_GPU_PDL && timeout $(pl_left 100) $D/kernels.test -test.count=1 -test.v \
  -test.run 'TestNVRTCCompilesEarlyModule$' > $R/pdlw/early-compile.log 2>&1; echo rc=$? >> $R/pdlw/early-compile.log) &
pl_bg=$!
(cd cuda/kernels && unset TILERT_GPU_PDL && TILERT_GPU_REPORT=$R/pdlw/kernels-report.txt timeout $(pl_left 90) $D/kernels.test \
  -test.count=1 -test.v -test.run 'TestPDLEarlyPrologue$|TestPDLEarlyPrologueCheck$|TestPDLKernelsWait$|TestKernelPDLEarlyChain$' \
  > $R/pdlw/kernels.log 2>&1; echo rc=$? >> $R/pdlw/kernels.log)
wait $pl_bg
# 2. the step, 1 and 4 slots at 8192, DeepSeek-V3.2 dims, 9 MoE layers: unset (plain) and =2 here, =1 in step 4
#    (each its own process, same weights seed). Prediction (NOTES "PDL mode 2 (pdlw)"): 1 slot p50 ~2.95 ms
#    unset, ~2.93 =1, ~2.88-2.90 =2 (65-66% of the floor); 4 slots ~-50 us.
pl_bench() {
  if [ $1 = unset ]; then pl_env="env -u TILERT_GPU_PDL"; else pl_env="env TILERT_GPU_PDL=$1"; fi
  $pl_env timeout $(pl_left 30) $D/tilert bench decode --device cuda --dummy-weights deepseek-v3.2 --layers 9 \
    --context 8192 --batches 1,4 --json $R/pdlw/bench-pdl-$1.json > $R/pdlw/bench-pdl-$1.txt 2>&1
  echo rc=$? >> $R/pdlw/bench-pdl-$1.txt
}
pl_bench unset
pl_bench 2
# 3. engine checks with =2 (the engine then runs the early module: TestKernelPDLModeEnv says so first):
#    graphs == eager, greedy == CPU, goldens. Expect PASS.
(cd cuda/kernels && TILERT_GPU_PDL=2 TILERT_GPU_REPORT=$R/pdlw/mode-report.txt timeout $(pl_left 10) $D/kernels.test -test.count=1 \
  -test.v -test.run 'TestKernelPDLModeEnv$' > $R/pdlw/mode.log 2>&1; echo rc=$? >> $R/pdlw/mode.log)
(cd engine/gpu && TILERT_GPU_PDL=2 TILERT_ENGINE_REPORT=$R/pdlw/engine-report.txt timeout $(pl_left 45) $D/engine.test -test.count=1 \
  -test.v -test.run 'TestGPUGraphsEqualEager$|TestGPUGreedyMatchesCPU$|TestGPUGolden$' > $R/pdlw/engine.log 2>&1
  echo rc=$? >> $R/pdlw/engine.log)
# 4. the step with =1 (mode 1: wait then trigger at every kernel's top), for the three-way comparison.
pl_bench 1
