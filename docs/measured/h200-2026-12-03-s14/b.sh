# Issue 10 (decode slows with context), helper idx131k: the indexer's serving pair at long rows.
# Run from the repo root on the H200 with kernels.test, engine.test and tilert built from this branch in .device/next/.
# New (TILERT_GPU_IDX_LONG, default on for rows > 32768 keys; =0 the kernels before):
#  - scores: indexer_scores_mma_d4 (same bits and histogram as indexer_scores_mma_pf): each warp's 16-key groups,
#    keys and scales, stream 4 deep through a per-warp cp.async ring (pf: one group in flight, the scales loaded after
#    the products: ~2 memory latencies a group, 4 groups a warp at 131072);
#  - top-k: topk_cl32 (few module): topk_fast's selection over a cluster of 8 blocks x 512 threads x 32 keys, the
#    digit counts summed through distributed shared memory (mark_l: 128 blocks, global lists, a grid counter and a
#    one-block final stage, ~13 us chain).
# Prediction (graph-timed pair, 1 row, 131072): ~34 -> ~14-18 us (scores ~23 -> ~8-10, top-k ~23 -> ~7-9 us);
# 8192 and 32768 unchanged (same kernels); decode step at 131072 -= ~0.15-0.2 ms over 10 indexer layers.
# Expected run time ~4-6 min (each step has its own timeout; step 5 only if under 300 s so far).
set -x
if ls .device/next/*.xz >/dev/null 2>&1; then (cd .device/next && for f in *.xz; do xz -d -f "$f"; done); fi
chmod +x .device/next/* 2>/dev/null
D=$PWD/.device/next
R=/tmp/idx131k; rm -rf $R; mkdir -p $R
export TILERT_KERNEL_CACHE=/tmp/tilert-kernels
save() { tar czf $OUT/idx131k.tgz -C $R .; }
# 1. Kernel correctness (GPU vs CPU reference and vs the kernels before), ~1 min.
(cd cuda/kernels && timeout 150 $D/kernels.test -test.run 'TestKernelTopKCluster|TestKernelIndexerDeep|TestNVRTCCompilesFewModule' -test.v > $R/kernels.log 2>&1; echo "rc=$?" >> $R/kernels.log)
grep -E "^(--- |ok|FAIL|rc=)|FAIL|Error" $R/kernels.log | head -30; save
# 2. Timing: old pair vs new pair (and every pairing, each depth) at 8192, 32768, 131072, 131072 x 4.
(cd cuda/kernels && TILERT_GPU_TIMING=1 timeout 120 $D/kernels.test -test.run 'TestKernelTimingIdxLong$' -test.v > $R/timing-long.log 2>&1; echo "rc=$?" >> $R/timing-long.log)
grep -E "graph long|rc=" $R/timing-long.log | head -80; save
# 3. Decode bench, new (default) and before (=0), 8192 and 131072 contexts.
bn() { local n=$1; shift; env "$@" timeout 120 $D/tilert bench decode --device cuda --dummy-weights deepseek-v3.2 --layers 9 --context 8192,131072 --batches 1 --json $R/$n.json > $R/$n.txt 2>&1; echo "rc=$?" >> $R/$n.txt; grep -A3 "p50 ms" $R/$n.txt | sed "s/^/$n $* /" >> $R/summary.txt; cp $R/summary.txt $OUT/summary.txt; }
bn long-on
bn long-off TILERT_GPU_IDX_LONG=0
cat $R/summary.txt; save
# 4. Engine: greedy output equals the CPU engine's with the long kernels on every row, and the related defaults.
(cd engine/gpu && timeout 150 $D/engine.test -test.run 'TestGPUIdxLong|TestGPUFewKernels' -test.v > $R/engine.log 2>&1; echo "rc=$?" >> $R/engine.log)
grep -E "^--- (PASS|FAIL)|^rc=|long-row kernel" $R/engine.log | tail -10; save
# 5. If time is left (~6 min budget): the whole idx/MLA timing table (timeIdxLong's rows again first).
[ $SECONDS -lt 300 ] && (cd cuda/kernels && TILERT_GPU_TIMING=1 timeout 60 $D/kernels.test -test.run 'TestKernelTimingIdxMLA$' -test.v > $R/timing-idxmla.log 2>&1; echo "rc=$?" >> $R/timing-idxmla.log)
save
