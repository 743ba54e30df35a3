# Ran in session 9 call C (results in pmoe/ beside this file). The kernel was removed in session 11 (the code last
# exists at b36a736); later revisions refuse TILERT_GPU_MOE_PERSIST, so this only records what ran.
# Fragment of helper pmoe (branch pmoe), issues 10 and 11: TILERT_GPU_MOE_PERSIST=1, the MoE half of a one-row
# decode layer (post-attention norm, router, routing, 8 routed + shared experts' gate/up and down, combine,
# residual add, next layer's input norm) as ONE persistent launch (moe_persist_m1, its own module
# cu/persist/moe_persist.cu; the default module is unchanged, so its cache entry stays warm). Device-wide
# barriers on a generation counter (no host reset; a wait past 2 s traps instead of hanging). NOT YET RUN.
# Needs $D (kernels.test, engine.test, tilert built from the branch) and $R (results dir); run from the repo
# root. Whole fragment <= 90 s: each step's timeout is the smaller of its own cap and what is left of 90 s;
# steps in the brief's order (expected: ~25 + 6 + 2x12 + 7 s, leaving ~25 s for the engine checks and the
# goldens). Step 1 compiles the persistent module (3 variants; 4.3 s with NVRTC 12.9 for sm_90a here, 5.5 s
# with 11.8) into the cache the later steps share; the default module is unchanged (a cache hit if an earlier
# step filled it).
export TILERT_KERNEL_CACHE=${TILERT_KERNEL_CACHE:-/tmp/tilert-kernels}
pm_t0=$SECONDS
pm_left() { local l=$((90 - (SECONDS - pm_t0))); [ $l -lt 1 ] && l=1; [ $l -lt $1 ] && echo $l || echo $1; }
rm -rf $R/pmoe; mkdir -p $R/pmoe
# 1. kernel checks: the persistent kernel (all three variants: TILERT_GPU_MOE_PERSIST_V unset, d16, b3) vs the
#    chain of launches it replaces, every output bit for bit (h, router logits, ids, weights, gate/up, down,
#    x, next norm / combine) at DeepSeek-V3.2 (256 experts, 7168x2048), its TP-8 shard (256-row experts),
#    GLM-like 6144x2048, the two tiny presets' dims and an odd shape; with and without o_proj's output to add,
#    the deferred norm, no shared expert, and the shard's combine-only form; each stage vs a float64
#    reference; 40 direct + 40 graph replays per case (barrier reuse). Expect: every row PASS, 0 differing
#    outputs, rel err ~1e-7 <= 1e-5.
(cd cuda/kernels && TILERT_GPU_REPORT=$R/pmoe/kernels-report.txt timeout $(pm_left 45) $D/kernels.test -test.count=1 -test.v \
  -test.run 'TestKernelMoEPersist$|TestMoEPersistPlan$|TestMoEPersistLaunchArgs$' > $R/pmoe/kernels.log 2>&1; echo rc=$? >> $R/pmoe/kernels.log)
# A device error (a trap from a barrier wait, a fault) or a timeout skips the =1 steps; a numeric mismatch alone
# (check rows FAIL, no CUDA error) does not: the timings still tell whether the design pays.
pm_ok=1; grep -q '^rc=0$' $R/pmoe/kernels.log || { grep -Eq 'CUDA_ERROR|^rc=12[4-9]$|^rc=13[0-9]$' $R/pmoe/kernels.log && pm_ok=0; }
echo "pm_ok=$pm_ok" >> $R/pmoe/kernels.log
# 2. timing (graph-timed, beside a 256 MiB d2d copy): the chain vs each variant on the same inputs,
#    DeepSeek-V3.2 full dims (all 256 experts distinct, device-filled: the 9 slots read 396 MB from HBM) and
#    the TP-8 shard dims (full form and the shard's combine-only form; 4 layers rotated), each with the x
#    reset (timed alone too). Prediction in cuda/kernels/NOTES.md "Persistent MoE half (pmoe)".
[ $pm_ok = 1 ] && (cd cuda/kernels && TILERT_GPU_TIMING=1 TILERT_GPU_REPORT=$R/pmoe/timing-report.txt timeout $(pm_left 12) \
  $D/kernels.test -test.count=1 -test.v -test.run 'TestKernelMoEPersistTiming$' > $R/pmoe/timing.log 2>&1; echo rc=$? >> $R/pmoe/timing.log)
# 3. the step, 1 slot at 8192, DeepSeek-V3.2 dims, 9 MoE layers: unset, then =1 (each its own process).
#    Prediction: -10..-25 us a MoE layer, p50 ~2.95 -> ~2.75-2.85 ms. If step 2 shows d16 or b3 faster than
#    the default variant, the lead can re-run this with TILERT_GPU_MOE_PERSIST_V=d16 / b3.
pm_bench() {
  if [ $1 = unset ]; then pm_env="env -u TILERT_GPU_MOE_PERSIST"; else pm_env="env TILERT_GPU_MOE_PERSIST=$1"; fi
  $pm_env timeout $(pm_left 18) $D/tilert bench decode --device cuda --dummy-weights deepseek-v3.2 --layers 9 \
    --context 8192 --batches 1 --json $R/pmoe/bench-persist-$1.json > $R/pmoe/bench-persist-$1.txt 2>&1
  echo rc=$? >> $R/pmoe/bench-persist-$1.txt
}
pm_bench unset
[ $pm_ok = 1 ] && pm_bench 1
# 4. the TP-8 shard layer timing with the switch (TILERT_GPU_TIMING=1 enables it; its MoE runs the
#    combine-only form: router + routing + experts + combine in one launch): compare with the unset rows of
#    earlier runs (94-115 us a shard layer, e.g. docs/measured/h200-2026-12-01-s4-pdl2). Prediction: -15..-25 us.
[ $pm_ok = 1 ] && (cd engine/gpu && TILERT_GPU_TIMING=1 TILERT_GPU_MOE_PERSIST=1 timeout $(pm_left 10) $D/engine.test -test.count=1 \
  -test.v -test.run 'TestGPUShardLayerTiming$' > $R/pmoe/shard-timing.log 2>&1; echo rc=$? >> $R/pmoe/shard-timing.log)
# 5. engine checks with the switch: TestGPUMoEPersistEqual (off vs on in-process, TILERT_GPU_NORM_FUSE unset/1/2:
#    same tokens, cache bytes and batched tokens; fails unless moePersist launches were recorded AND the
#    barrier's generation counter on the device moved, i.e. the kernel ran), greedy == CPU (MTP off = one-row
#    steps). Expect PASS and the log line "TILERT_GPU_MOE_PERSIST=1: the MoE half of one-row decode layers runs
#    as one persistent launch".
[ $pm_ok = 1 ] && (cd engine/gpu && TILERT_GPU_MOE_PERSIST=1 TILERT_ENGINE_REPORT=$R/pmoe/engine-report.txt timeout $(pm_left 30) \
  $D/engine.test -test.count=1 -test.v -test.run 'TestGPUMoEPersistEqual$|TestGPUGreedyMatchesCPU$' \
  > $R/pmoe/engine.log 2>&1; echo rc=$? >> $R/pmoe/engine.log)
# 6. (what time is left) the HF goldens with the switch, teacher-forced one row a forward
#    (TILERT_GPU_PREFILL_CHUNK=1, so every position runs the persistent launch; TeacherForce otherwise prefills
#    in chunks, where it never runs). Expect PASS (the emulator, whose moePersist is the chain, gives dense
#    20/20, 20/20, 19/20, 17/20 this way).
[ $pm_ok = 1 ] && (cd engine/gpu && TILERT_GPU_PREFILL_CHUNK=1 TILERT_GPU_MOE_PERSIST=1 TILERT_ENGINE_REPORT=$R/pmoe/golden-report.txt \
  timeout $(pm_left 15) $D/engine.test -test.count=1 -test.v -test.run 'TestGPUGolden$' > $R/pmoe/golden.log 2>&1
  echo rc=$? >> $R/pmoe/golden.log)
true
