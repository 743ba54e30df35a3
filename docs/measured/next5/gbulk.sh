# Fragment of helper gbulk (branch gbulk), issue 10: TILERT_GPU_GEMV_BULK=1, the one-row fp8 GEMVs (dense, with
# residual, gate-up paired) and the MoE expert slots on gemv_bulk_fp8 (sm_90a module, cu/wg/gemv_bulk.cu):
# weights streamed by cp.async.bulk into a ring of 16 KiB shared-memory stages (6 stages a block, 2 blocks an
# SM: 192 KiB in flight per SM), one producer warp, 8 consumer warps, persistent blocks.
# Needs $D (kernels.test, engine.test, tilert built from the branch) and $R (results dir); run from the repo
# root. Whole fragment <= 120 s: each step's timeout is the smaller of its own cap and what is left of 120 s.
# The sm_90a module changed (a new file), so step 1 compiles it once (NVRTC 12+/13 on the device, ~10-20 s)
# into the cache the later steps share; the default module is unchanged (cache hit if an earlier run filled it).
export TILERT_KERNEL_CACHE=${TILERT_KERNEL_CACHE:-/tmp/tilert-kernels}
export TILERT_GPU_BULK_CHECK=1 # its GPU tests are opt-in until this fragment has run
gb_t0=$SECONDS
gb_left() { local l=$((120 - (SECONDS - gb_t0))); [ $l -lt 1 ] && l=1; [ $l -lt $1 ] && echo $l || echo $1; }
rm -rf $R/gbulk; mkdir -p $R/gbulk
# 1. kernel checks: bulk vs the float64 reference (dense, resid, resid == y, gate-up, 8 routed + shared experts
#    gate-up and down), repeat bit-identical, == the tile kernel bit for bit (same G), G pinned 32/128/256,
#    1 and 2 blocks per SM, N = 5..24576 not multiples of the tile, K = 16, 1040, 1536, 2048, 7168, 16384.
#    Expect: every row PASS (rel err ~1e-7 <= 1e-5, 0 differing outputs). A hang (rc=124) means a pipeline
#    deadlock: the later bulk steps are skipped then.
(cd cuda/kernels && TILERT_GPU_REPORT=$R/gbulk/kernels-report.txt timeout $(gb_left 30) $D/kernels.test -test.count=1 -test.v \
  -test.run 'TestKernelGemvBulk$|TestGemvBulkArgs$|TestBulkLayout$' > $R/gbulk/kernels.log 2>&1; echo rc=$? >> $R/gbulk/kernels.log)
gb_ok=1; grep -q '^rc=0$' $R/gbulk/kernels.log || gb_ok=0
# 2. timing (graph-timed, weights cold, beside a 1 GiB d2d copy and the tile kernel): o_proj 7168x16384,
#    q_b 24576x1536, 9 gate-up slots 2x2048x7168, 9 down slots 7168x2048; B=2 and B=1, plus a G x B sweep
#    (log). Prediction below.
[ $gb_ok = 1 ] && (cd cuda/kernels && TILERT_GPU_TIMING=1 TILERT_GPU_REPORT=$R/gbulk/timing-report.txt timeout $(gb_left 20) \
  $D/kernels.test -test.count=1 -test.v -test.run 'TestKernelBulkTiming$' > $R/gbulk/timing.log 2>&1; echo rc=$? >> $R/gbulk/timing.log)
# 3. the step, 1 slot at 8192, DeepSeek-V3.2 dims, 9 MoE layers: unset, then =1 (each its own process).
gb_bench() {
  if [ $1 = unset ]; then gb_env="env -u TILERT_GPU_GEMV_BULK"; else gb_env="env TILERT_GPU_GEMV_BULK=$1"; fi
  $gb_env timeout $(gb_left 25) $D/tilert bench decode --device cuda --dummy-weights deepseek-v3.2 --layers 9 \
    --context 8192 --batches 1 --json $R/gbulk/bench-bulk-$1.json > $R/gbulk/bench-bulk-$1.txt 2>&1
  echo rc=$? >> $R/gbulk/bench-bulk-$1.txt
}
gb_bench unset
[ $gb_ok = 1 ] && gb_bench 1
# 4. engine checks with the switch (tolerance-based; the bulk GEMV gives the tile kernel's bits, so they are
#    the default run's numbers): TestGPUGemvBulk (greedy == CPU with the switch set in-process, and fails unless
#    gemv_bulk_fp8 actually ran: "ran N launches"), greedy == CPU, goldens. Expect PASS, and the log line
#    "TILERT_GPU_GEMV_BULK=1: the bulk-copy GEMV (sm_90a module) runs ...".
[ $gb_ok = 1 ] && (cd engine/gpu && TILERT_GPU_GEMV_BULK=1 TILERT_ENGINE_REPORT=$R/gbulk/engine-report.txt timeout $(gb_left 40) \
  $D/engine.test -test.count=1 -test.v -test.run 'TestGPUGemvBulk$|TestGPUGreedyMatchesCPU$|TestGPUGolden$' > $R/gbulk/engine.log 2>&1
  echo rc=$? >> $R/gbulk/engine.log)
true
