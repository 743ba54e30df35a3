# Fragment of helper flow (branch flow), issues 10 and 11: TILERT_GPU_MOE_PERSIST=1 with TILERT_GPU_MOE_PERSIST_V=flow,
# the MoE half of a one-row decode layer as ONE persistent launch WITHOUT device-wide barriers (moe_flow_m1,
# cu/persist/moe_flow.cu in the persistent module; the default module is unchanged, its cache entry stays warm):
# blocks take tasks in a fixed order from a ticket counter, wait only on the readiness counters of their inputs,
# and issue their own weight loads (plus an L2 prefetch of the rest of the tile, and of the next ticket's first
# lines) before they wait. Variants: flow (both prefetches), flow_pf (the tile's own only), flow_np (neither),
# flow_r4 (flow with tiles of 4 rows a group: twice the tasks at half the size; the same sums).
# NOT YET RUN ON A GPU. Needs $D (kernels.test, engine.test, tilert built from the branch) and $R (results dir);
# run from the repo root. <= 90 s: each step's timeout is the smaller of its own cap and what is left of 90 s.
# Step 1 compiles the persistent module (7 kernels; NVRTC 12.9 for sm_90a: 14-21 s on this 2-core machine, where
# main's 3 took 10.8 s; NOTES measured 4.3 s for main's on the device machine, so expect ~6-9 s) into the cache
# the later steps share.
export TILERT_KERNEL_CACHE=${TILERT_KERNEL_CACHE:-/tmp/tilert-kernels}
fl_t0=$SECONDS
fl_left() { local l=$((90 - (SECONDS - fl_t0))); [ $l -lt 1 ] && l=1; [ $l -lt $1 ] && echo $l || echo $1; }
rm -rf $R/flow; mkdir -p $R/flow
# 1. kernel checks (four flow variants). TestMoEFlowSchedule (pure Go: the ticket order covers every row once, no task waits on a
#    higher ticket, 1/2/5/132/264 blocks finish; a broken order fails). TestKernelMoEPersist with the three flow
#    variants vs the chain of launches, every output bit for bit (h, router logits, ids, weights, gate/up, down,
#    x, next norm / combine) on fresh random layers: DeepSeek-V3.2 (256 experts, 7168x2048), the TP-8 shard
#    (256-row experts, both forms), GLM-like 6144x2048 (GLM-5's MoE dims, no groups), the tiny presets' dims, an
#    odd shape; with/without o_proj's output, deferred norm, no shared expert, combine-only; 40 direct + 40 graph
#    replays each; and per flow launch: control word 15 (launch count) +1 and every ticket/readiness counter (words 2-8, 48-63)
#    back at 0 ("moe_flow launch counted, counters reset" rows). Expect every row PASS, 0 differing outputs.
(cd cuda/kernels && TILERT_GPU_MOE_PERSIST_VS=flow,flow_pf,flow_np,flow_r4 TILERT_GPU_REPORT=$R/flow/kernels-report.txt \
  timeout $(fl_left 45) $D/kernels.test -test.count=1 -test.v \
  -test.run 'TestKernelMoEPersist$|TestMoEFlowSchedule$|TestMoEPersistPlan$|TestMoEPersistLaunchArgs$' > $R/flow/kernels.log 2>&1
  echo rc=$? >> $R/flow/kernels.log)
# A device error (a trap from a 2 s wait, a fault) or a timeout skips the switch's steps; a numeric mismatch alone
# (rows FAIL, no CUDA error) does not: the timings still say whether the design pays.
fl_ok=1; grep -q '^rc=0$' $R/flow/kernels.log || { grep -Eq 'CUDA_ERROR|^rc=12[4-9]$|^rc=13[0-9]$' $R/flow/kernels.log && fl_ok=0; }
echo "fl_ok=$fl_ok" >> $R/flow/kernels.log
# 2. timing (graph-timed beside a 256 MiB d2d copy, weights cold): the chain, moe_persist_m1 and the three flow
#    variants on the same inputs, DeepSeek-V3.2 dims (396 MB from HBM) and the TP-8 shard (full form and the
#    shard's combine-only form). Prediction (NOTES "moe_flow"): full dims chain 129.9 / persist 139.0 ->
#    flow ~118-128 us; shard form chain 38.8 / persist 51.6 -> flow ~24-30 us; shard full form chain 45.8 ->
#    flow ~28-34 us. flow vs flow_pf says what the next-ticket prefetch gives, flow_pf vs flow_np the tile's own,
#    flow_r4 vs flow the task size (expect r4 ~2-4 us faster on the shard; if so, rerun steps 4-5 with
#    TILERT_GPU_MOE_PERSIST_V=flow_r4).
[ $fl_ok = 1 ] && (cd cuda/kernels && TILERT_GPU_MOE_PERSIST_VS=,flow,flow_pf,flow_np,flow_r4 TILERT_GPU_TIMING=1 \
  TILERT_GPU_REPORT=$R/flow/timing-report.txt timeout $(fl_left 15) $D/kernels.test -test.count=1 -test.v \
  -test.run 'TestKernelMoEPersistTiming$' > $R/flow/timing.log 2>&1; echo rc=$? >> $R/flow/timing.log)
# 3. engine: TestGPUMoEFlowEqual (off vs on in-process with the flow variant, TILERT_GPU_NORM_FUSE unset/1/2, both
#    tiny presets: same tokens, cache bytes and batched tokens; fails unless moePersist launches were recorded
#    AND the flow kernel's launch count on the device moved, and every flow counter is back at 0).
[ $fl_ok = 1 ] && (cd engine/gpu && TILERT_ENGINE_REPORT=$R/flow/engine-report.txt timeout $(fl_left 20) \
  $D/engine.test -test.count=1 -test.v -test.run 'TestGPUMoEFlowEqual$' > $R/flow/engine.log 2>&1; echo rc=$? >> $R/flow/engine.log)
# 4. the TP-8 shard layer with the switch (its MoE is the combine-only form), then unset in the same call for
#    the comparison. Prediction: the moePersist row ~60 us (persist) -> ~25-32 us; the shard layer ~107/127 us
#    (ranks 1-7 / rank 0 with persist) -> ~75-80 / ~95-100 us, vs unset's chain ~85-90 / ~105-110.
[ $fl_ok = 1 ] && (cd engine/gpu && TILERT_GPU_TIMING=1 TILERT_GPU_MOE_PERSIST=1 TILERT_GPU_MOE_PERSIST_V=flow \
  timeout $(fl_left 12) $D/engine.test -test.count=1 -test.v -test.run 'TestGPUShardLayerTiming$' > $R/flow/shard-timing.log 2>&1
  echo rc=$? >> $R/flow/shard-timing.log)
(cd engine/gpu && TILERT_GPU_TIMING=1 timeout $(fl_left 12) env -u TILERT_GPU_MOE_PERSIST -u TILERT_GPU_MOE_PERSIST_V \
  $D/engine.test -test.count=1 -test.v -test.run 'TestGPUShardLayerTiming$' > $R/flow/shard-timing-unset.log 2>&1
  echo rc=$? >> $R/flow/shard-timing-unset.log)
# 5. only if >= 50 s are left (unlikely after steps 1-4): the step, 1 slot at 8192, DeepSeek-V3.2 dims, 9 MoE
#    layers, unset then the switch (each its own process). Prediction: the flow kernel -5..-12 us a MoE layer
#    against the chain at full dims, p50 ~-0.05..-0.1 ms of ~2.9 ms. Else bench-skipped.txt says so.
fl_bench() {
  if [ $1 = unset ]; then fl_env="env -u TILERT_GPU_MOE_PERSIST -u TILERT_GPU_MOE_PERSIST_V"
  else fl_env="env TILERT_GPU_MOE_PERSIST=1 TILERT_GPU_MOE_PERSIST_V=flow"; fi
  $fl_env timeout $(fl_left 30) $D/tilert bench decode --device cuda --dummy-weights deepseek-v3.2 --layers 9 \
    --context 8192 --batches 1 --json $R/flow/bench-$1.json > $R/flow/bench-$1.txt 2>&1
  echo rc=$? >> $R/flow/bench-$1.txt
}
if [ $fl_ok = 1 ] && [ $((90 - (SECONDS - fl_t0))) -ge 50 ]; then
  fl_bench unset
  fl_bench flow
else
  echo "bench pair skipped: $((90 - (SECONDS - fl_t0))) s of 90 left (or fl_ok=$fl_ok)" > $R/flow/bench-skipped.txt
fi
true
