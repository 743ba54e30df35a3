# Fragment of helper gmid (branch gmid), issue 10: TILERT_GPU_GEMV_MID=1, the one-row attention-input projections
# on the gemv_mid_group kernels (cuda/kernels/cu/mid/gemv_mid.cu, a module of its own loaded on first use): the
# layer input's grouped launch (q_a, kv_a, indexer wk, weights_proj: 2304 x 7168) with every thread's share in
# flight in one round, and q_b + indexer wq_b (32768 x 1536) as one such launch over the raw q_a with q_a's RMSNorm
# in its prologue, the weights' round issued before the prologue (4 launches a layer -> 2; =2: rmsnorm kept, 3).
# Same group sizes and rmsnorm's own sums, so the same bits as the default (checked below, bit for bit).
# Needs $D (kernels.test, engine.test, tilert built from the branch) and $R (results dir); run from the repo root.
# Whole fragment <= 90 s: each step's timeout is the smaller of its own cap and what is left of 90 s.
# The main module's source is main's (kernel_ptx_diff main WORKTREE: 227 identical; a cache hit if an earlier run
# filled it: with a cold cache step 1 would spend ~65 s compiling it and the later steps would be cut); the mid
# module is new: step 1 compiles it once (~1-4 s with NVRTC 11.8 / 12.9 here) into the cache the later steps share.
# Dry run here (no GPU): every test name matches and skips, tilert parses the flags (fails at cuInit), 1.2 s.
export TILERT_KERNEL_CACHE=${TILERT_KERNEL_CACHE:-/tmp/tilert-kernels}
gm_t0=$SECONDS
gm_left() { local l=$((90 - (SECONDS - gm_t0))); [ $l -lt 1 ] && l=1; [ $l -lt $1 ] && echo $l || echo $1; }
rm -rf $R/gmid; mkdir -p $R/gmid
# 1. kernel checks: each of r8_d16 (the default), r4_d16, r4_o4, r2_o4 and their _n (norm) twins against the
#    float64 reference (<= 1e-5), == the default grouped launch bit for bit (with the norm also == rmsnorm + the
#    grouped launch), repeat bit for bit, the mid kernel ran; the decode shapes (layer input 1536+576+128 fp8 + 64
#    bf16 x 7168, with and without the norm; q_b 24576 + wq_b 8192 x 1536, with and without q_a's norm) and odd
#    ones (N 1..301, K 16..2048, padded x), G by the rule and (but the q_b-sized) pinned to 32; fallbacks do not run it.
#    Expect: every row PASS (0 differing outputs).
(cd cuda/kernels && TILERT_GPU_REPORT=$R/gmid/kernels-report.txt timeout $(gm_left 16) $D/kernels.test -test.count=1 -test.v \
  -test.run 'TestKernelGemvGroupMid$|TestGroupMidKernelsDefined$' > $R/gmid/kernels.log 2>&1; echo rc=$? >> $R/gmid/kernels.log)
gm_ok=1; grep -q '^rc=0$' $R/gmid/kernels.log || gm_ok=0
# 2. timing (graph-timed, weights cold, one row): the layer input 2304x7168; q_b + wq_b with q_a's norm (today:
#    rmsnorm + two tile GEMVs; the default grouped kernel with its prologue; each mid shape's _n kernel = =1; rmsnorm
#    + the grouped kernel (GROUP=3); rmsnorm + mid r8_d16 = =2); q_b + wq_b without; q_b alone; wq_b alone: each beside
#    a d2d copy of the same bytes; then a sweep shape x G (G=0 the rule's; others change the summation order) in the
#    log ("sweep ..." lines). Prediction in cuda/kernels/NOTES.md (gmid).
[ $gm_ok = 1 ] && (cd cuda/kernels && TILERT_GPU_TIMING=1 TILERT_GPU_REPORT=$R/gmid/timing-report.txt timeout $(gm_left 12) \
  $D/kernels.test -test.count=1 -test.v -test.run 'TestKernelGroupMidTiming$' > $R/gmid/timing.log 2>&1; echo rc=$? >> $R/gmid/timing.log)
# 3. the step, 1 slot at 8192, DeepSeek-V3.2 dims, 9 MoE layers: unset, then =1 (each its own process). =2 (rmsnorm
#    kept, q_b + wq_b grouped) only if time is left (it will not be within 90 s: run `gm_bench 2` after, if wanted).
gm_bench() {
  if [ $1 = unset ]; then gm_env="env -u TILERT_GPU_GEMV_MID"; else gm_env="env TILERT_GPU_GEMV_MID=$1"; fi
  $gm_env timeout $(gm_left 24) $D/tilert bench decode --device cuda --dummy-weights deepseek-v3.2 --layers 9 \
    --context 8192 --batches 1 --json $R/gmid/bench-mid-$1.json > $R/gmid/bench-mid-$1.txt 2>&1
  echo rc=$? >> $R/gmid/bench-mid-$1.txt
}
gm_bench unset
[ $gm_ok = 1 ] && gm_bench 1
# 4. engine checks: TestGPUGemvMid (greedy == CPU and the goldens with =1 and with =2, set in-process; fails unless a
#    gemv_mid_group kernel ran in each), TestGPUGemvMidProjections (tokens and cache bytes == the separate launches
#    for the default, =1 and =2, one slot +-MTP and two batched; the one-row graphs hold the q_b + wq_b grouped
#    launch, and with =1 fewer rmsnorm launches; fails unless the mid kernel ran). Expect PASS, "ran N launches".
[ $gm_ok = 1 ] && (cd engine/gpu && TILERT_GPU_GEMV_MID=1 TILERT_ENGINE_REPORT=$R/gmid/engine-report.txt timeout $(gm_left 20) \
  $D/engine.test -test.count=1 -test.v -test.run 'TestGPUGemvMid$|TestGPUGemvMidProjections$' > $R/gmid/engine.log 2>&1
  echo rc=$? >> $R/gmid/engine.log)
[ $gm_ok = 1 ] && [ $((90 - (SECONDS - gm_t0))) -ge 22 ] && gm_bench 2
grep -h "8192" $R/gmid/bench-mid-*.txt; grep -c PASS $R/gmid/kernels-report.txt 2>/dev/null; grep -c FAIL $R/gmid/kernels-report.txt 2>/dev/null
grep -h "sweep" $R/gmid/timing.log 2>/dev/null; tail -3 $R/gmid/engine.log 2>/dev/null
true
