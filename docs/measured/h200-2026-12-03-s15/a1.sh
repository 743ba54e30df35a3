# Helper idxone (session 15, issue 10): the serving indexer's pair for rows > 32768 keys (indexer_scores_mma_pf +
# topk_radix_mark_l, two launches) as one launch, indexer_topk_one (cu/indexer_one.cu): the scores by the same code
# (bits equal to _pf), two grid barriers in a one-wave grid, the threshold bin's keys listed once and refined by every
# block, each block writing its own segments' selection in index order. Engine switch TILERT_GPU_IDX_ONE=1
# (cooperative launch) or =plain (plain launch); default off.
# Prediction (graph-timed, 1 row, cold keys): pair 27.6 -> ~19 us at 131072 / 131328, ~21 -> ~13-14 at 65536, about
# even at 32768 (the engine keeps topk_radix_one32 there); cooperative maybe +1-2 us over plain. Decode at 131072
# 2.895 -> ~2.76 ms (the pair's ~43 us a layer on the critical path -> ~28-30); 8192 unchanged. Reasoning:
# cuda/kernels/NOTES.md "Scores and the long-row top-k in one launch".
# Run from the repo root with kernels.test, engine.test and tilert built from this branch in .device/next/ (xz'd or
# not; the usual line of docs/measured/next/run.sh). ~4 min on a warm H200; steps 3b and 5 only if time is left.
set -x
if ls .device/next/*.xz >/dev/null 2>&1; then (cd .device/next && for f in *.xz; do xz -d -f "$f"; done); fi
chmod +x .device/next/* 2>/dev/null
D=$PWD/.device/next
R=/tmp/idxone; rm -rf $R; mkdir -p $R
export TILERT_KERNEL_CACHE=/tmp/tilert-kernels
save() { tar czf $OUT/idxone.tgz -C $R .; cp $R/summary.txt $OUT/summary.txt 2>/dev/null; }
# 1. Correctness (~60-90 s with the cold NVRTC cache): scores bitwise vs _pf, selections vs the pair and refTopK
#    (ties, narrow rows, lengths changing, one scratch left zeroed, graph replays, plain and cooperative).
(cd cuda/kernels && timeout 170 $D/kernels.test -test.run 'TestKernelIndexerTopKOne$' -test.v > $R/kernels.log 2>&1; echo "rc=$?" >> $R/kernels.log)
grep -E "^--- |^rc=|FAIL" $R/kernels.log | head -20 | tee -a $R/summary.txt; save
# 2. Timing: the pair vs indexer_topk_one (plain, coop) at 32768, 65536, 131072, 131328 x 1 row, 131072 x 4; one bin.
(cd cuda/kernels && TILERT_GPU_TIMING=1 timeout 90 $D/kernels.test -test.run 'TestKernelTimingIdxOne$' -test.v > $R/timing.log 2>&1; echo "rc=$?" >> $R/timing.log)
grep -E "timing_test.go:[0-9]+: graph: |^rc=|does not fit|panic" $R/timing.log | tee -a $R/summary.txt; save
# 3. Decode, off then =1 (cooperative), 8192 and 131072; 3b =plain if time is left.
bn() { local n=$1; shift; env "$@" timeout 100 $D/tilert bench decode --device cuda --dummy-weights deepseek-v3.2 --layers 9 --context 8192,131072 --batches 1 --json $R/$n.json > $R/$n.txt 2>&1; echo "rc=$?" >> $R/$n.txt; grep -A3 "p50 ms" $R/$n.txt | sed "s/^/$n $* /" >> $R/summary.txt; save; }
bn one-off
bn one-coop TILERT_GPU_IDX_ONE=1
[ $SECONDS -lt 170 ] && bn one-plain TILERT_GPU_IDX_ONE=plain
# 4. Engine: greedy == CPU with the fused kernel on every row past index_topk (=1 and =plain), the TP shard (=1).
(cd engine/gpu && timeout 120 $D/engine.test -test.run 'TestGPUIdxOne$' -test.v > $R/engine.log 2>&1; echo "rc=$?" >> $R/engine.log)
grep -E "^--- (PASS|FAIL)|^rc=|fused launches|never ran" $R/engine.log | tail -8 | tee -a $R/summary.txt; save
# 5. If time is left: the existing indexer / top-k kernel checks (the pair itself, unchanged).
[ $SECONDS -lt 200 ] && (cd cuda/kernels && timeout 60 $D/kernels.test -test.run 'TestKernelIndexer$' -test.v > $R/kernels-indexer.log 2>&1; echo "rc=$?" >> $R/kernels-indexer.log)
grep -E "^--- |^rc=" $R/kernels-indexer.log 2>/dev/null | tee -a $R/summary.txt; save
