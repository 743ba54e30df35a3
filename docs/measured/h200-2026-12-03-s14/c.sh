# Helper grp (session 14, issue 10): the split grouped GEMV (TILERT_GPU_GROUP_SPLIT, default on; =0 keeps
# gemv_group). The one-row layer-input group (DeepSeek-V3.2 2304 x 7168, 16.9 MB: 9.70 us graph-timed on gemv_group,
# a copy of its bytes 5.24 us, session 9) on gemv_group_split_r4: each block's weights (4 fp8 rows or 2 bf16 rows,
# 28 KiB) cp.async'd into shared memory at once, 592 blocks in one wave (6 a SM by the 40-register bound, 7 by
# shared memory), instead of one 16-byte chunk of each of 8 rows per round (2 serial DRAM round trips a thread, 4 for
# weights_proj's bf16 rows, each behind the launch's whole queue). Prediction: ~6 us (5.24 copy + ~0.7), i.e.
# -3.5 us a layer, ~-35 us a 9-layer step at 8192 if the in-graph saving matches (the profile's 87 us in graph).
# If the split kernel is no faster, the sweep line (shared memory / rows a block) says whether 8 rows (3 blocks a
# SM, 57 KiB) or 1-2 rows (more blocks, two waves) do better. Bits: the kernel test compares with gemv_group.
# Run from the repo root with the binaries (kernels.test, engine.test, tilert) in .device/next/ (xz'd or not).
set -x
cd .device/next && for f in *.xz; do [ -e "$f" ] && xz -d -f "$f"; done; chmod +x *; cd ../..
D=$PWD/.device/next
R=/tmp/grp; rm -rf $R; mkdir -p $R
export TILERT_KERNEL_CACHE=/tmp/tilert-kernels
save() { tar czf $OUT/grp.tgz -C $R .; cp $R/summary.txt $OUT/summary.txt 2>/dev/null; }
# 1. Bits: the split kernel against gemv_group on fresh random inputs (DeepSeek, GLM-5, odd shapes; tile rules 1 and
#    3; R pinned 1, 2, 8), and the plan arithmetic. Warms the NVRTC cache.
(cd cuda/kernels && timeout 170 $D/kernels.test -test.run 'TestKernelGemvGroupSplit$|TestGroupSplitPlan$' -test.v > $R/kernels-bits.log 2>&1; echo "rc=$?" >> $R/kernels-bits.log)
grep -E "^--- |^rc=|differing outputs.*FAIL|ran=" $R/kernels-bits.log | tail -8 | tee -a $R/summary.txt; save
# 2. Timing (graph, weights cold): gemv_group vs split at both models' shapes, the copy rate, the sweep.
(cd cuda/kernels && TILERT_GPU_TIMING=1 timeout 90 $D/kernels.test -test.run 'TestKernelGroupSplitTiming$' -test.v > $R/timing.log 2>&1; echo "rc=$?" >> $R/timing.log)
grep -E "split:|attn in|sweep|^rc=" $R/timing.log | grep -v "^ *timing_test" | tail -12 | tee -a $R/summary.txt; save
# 3. The decode step, each model with and without the switch (off first: the same order both times).
bn() { local m=$1 n=$2 t=$3; shift 3; env "$@" timeout $t $D/tilert bench decode --device cuda --dummy-weights $m --layers 9 --context 8192 --batches 1 --json $R/$n.json > $R/$n.txt 2>&1; echo "rc=$?" >> $R/$n.txt; grep -A1 "p50 ms" $R/$n.txt | tail -1 | sed "s/^/$n $* /" >> $R/summary.txt; save; }
bn deepseek-v3.2 ds-split0 120 TILERT_GPU_GROUP_SPLIT=0
bn deepseek-v3.2 ds-split 45
bn glm-5 glm-split0 60 TILERT_GPU_GROUP_SPLIT=0
bn glm-5 glm-split 45
bn deepseek-v3.2 ds-split0-2 45 TILERT_GPU_GROUP_SPLIT=0
bn deepseek-v3.2 ds-split-2 45
# 4. The engine: split == gemv_group tokens and cache bytes on every preset, greedy == CPU and goldens with it;
#    the grouped and mid projections' equalities under the new default.
(cd engine/gpu && timeout 200 $D/engine.test -test.run 'TestGPUGroupSplit$|TestGPUGroupedProjectionsEqualSeparate$|TestGPUGemvMidProjections$|TestGPUGreedyMatchesCPU$' -test.v > $R/engine.log 2>&1; echo "rc=$?" >> $R/engine.log)
grep -E "^--- |^rc=|gemv_group_split ran" $R/engine.log | tail -10 | tee -a $R/summary.txt; save
# 5. Optional (GRP_PROFILE=1, ~2 x 60 s): the step's profile with and without the switch, for the in-graph
#    "gemvGroup 2304x7168x1" line (87 us for 10 calls on gemv_group).
if [ "$GRP_PROFILE" = 1 ]; then
  for v in 0 1; do (TILERT_GPU_GROUP_SPLIT=$v timeout 100 $D/tilert bench decode --device cuda --dummy-weights deepseek-v3.2 --layers 9 --context 8192 --batches 1 --profile > $R/profile-split$v.txt 2>&1); grep -i "gemvGroup" $R/profile-split$v.txt | head -4 | sed "s/^/profile split=$v: /" >> $R/summary.txt; save; done
fi
