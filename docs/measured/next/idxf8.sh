# Helper idxf8 (session 15, issue 10): the serving indexer's scores on mma.sync m16n8k32 e4m3 (indexer_scores_f8,
# cu/indexer_mma_f8.cu; engine switch TILERT_GPU_IDX_F8=1, opt-in) against indexer_scores_mma_pf.
# Prediction (cuda/kernels/NOTES.md, "The indexer scores on the fp8 mma.sync"): SLOWER on the H200, because ptxas
# lowers the e4m3 mma.sync on sm_90 to e4m3->f16 conversions + two HMMA.16816.F32 + 4 FADD of C (SASS read with
# nvdisasm): 131072 keys 12.9 -> ~17-20 us (scores + hist), the accumulation f32 like the f16 path (not the ~14
# bits of wgmma's fp8), scores within a few ulps of _pf, the top-2048 selection equal or 0-2 keys apart.
# Run from the repo root with kernels.test, engine.test and tilert built from this branch in .device/next/ (xz'd or
# not; the lead's usual build line, docs/measured/next/run.sh). ~3-4 min warm; each step has its own timeout.
set -x
if ls .device/next/*.xz >/dev/null 2>&1; then (cd .device/next && for f in *.xz; do xz -d -f "$f"; done); fi
chmod +x .device/next/* 2>/dev/null
D=$PWD/.device/next
R=/tmp/idxf8; rm -rf $R; mkdir -p $R
export TILERT_KERNEL_CACHE=/tmp/tilert-kernels
save() { tar czf $OUT/idxf8.tgz -C $R .; cp $R/summary.txt $OUT/summary.txt 2>/dev/null; }
# 1. Correctness first: the e4m3 mma's accumulation (ACCUM lines: crafted 2^8 + 2^(8-j) cases and random products
#    vs exact sums, beside the f16 path), the scores vs the float64 codes with the tolerance derived from it, vs _pf
#    (SCORES: bit-identical share), histogram vs its own scores, the top-2048 vs _pf's and the exact scores'
#    (SELECTION, 8192 and 131072 keys), the rows kernel vs one launch per row. Warms the NVRTC cache.
(cd cuda/kernels && timeout 170 $D/kernels.test -test.run 'TestKernelIndexerF8$' -test.v > $R/kernels.log 2>&1; echo "rc=$?" >> $R/kernels.log)
grep -E "ACCUM|SCORES|SELECTION|score tolerance|^--- |^rc=|FAIL" $R/kernels.log | sed 's/^ *//' | tee -a $R/summary.txt; save
# 2. Timing, graph-timed (cold keys over 4 copies): _pf vs f8, scores + hist and the pair with the engine's top-k,
#    1 and 4 rows at 8192, 32768, 131072.
(cd cuda/kernels && TILERT_GPU_TIMING=1 timeout 100 $D/kernels.test -test.run 'TestKernelTimingIdxF8$' -test.v > $R/timing.log 2>&1; echo "rc=$?" >> $R/timing.log)
grep -E "graph: |copy|^rc=" $R/timing.log | sed 's/^ *//' | tee -a $R/summary.txt; save
# 3. Decode step, switch off then on (DeepSeek-V3.2 dims, 9 layers, 1 slot, 8192 and 131072).
bn() { local n=$1 t=$2; shift 2; env "$@" timeout $t $D/tilert bench decode --device cuda --dummy-weights deepseek-v3.2 --layers 9 --context 8192,131072 --batches 1 --json $R/$n.json > $R/$n.txt 2>&1; echo "rc=$?" >> $R/$n.txt; grep -A3 "p50 ms" $R/$n.txt | sed "s/^/$n $* /" >> $R/summary.txt; save; }
bn f8-off 100
bn f8-on 70 TILERT_GPU_IDX_F8=1
# 4. If time is left: greedy tokens on the trained tiny models equal the CPU engine's with the f8 scores (and the
#    kernel ran).
[ $SECONDS -lt 210 ] && (cd engine/gpu && timeout 100 $D/engine.test -test.run 'TestGPUIdxF8$' -test.v > $R/engine.log 2>&1; echo "rc=$?" >> $R/engine.log)
grep -E "^--- |^rc=|indexer_scores_f8 launches" $R/engine.log 2>/dev/null | tail -6 | tee -a $R/summary.txt; save
