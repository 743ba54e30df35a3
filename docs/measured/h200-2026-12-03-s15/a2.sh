# Helper idxf8 (session 15, issue 10): the serving indexer's scores on the fp8 tensor-core instructions, against
# indexer_scores_mma_pf (f16 mma.sync): indexer_scores_f8 (mma.sync m16n8k32 e4m3, cu/indexer_mma_f8.cu;
# TILERT_GPU_IDX_F8=1) and indexer_scores_wg (wgmma m64n64k32 e4m3, cu/wg/wg_indexer.cu, the sm_90a module;
# TILERT_GPU_IDX_F8=wg). Both opt-in. Predictions (cuda/kernels/NOTES.md, "The indexer scores on the fp8 mma.sync
# and on wgmma"):
#  - f8: SLOWER (ptxas lowers the e4m3 mma.sync on sm_90 to e4m3->f16 conversions + two HMMA.16816.F32 + 4 FADD,
#    read in the SASS): 131072 keys 12.9 -> ~14-20 us; accumulation f32 like the f16 path; selection = _pf's or
#    0-2 keys apart.
#  - wg: native QGMMA: 131072 12.9 -> ~6-8 us, 8192 ~3-4 us; accumulation ~14 bits (DeepSeek-V3's figure for fp8
#    wgmma); scores ~1e-4 off, top-2048 a few keys from _pf's at 8192, ~5-20 at 131072 on random keys. The engine
#    check (greedy == CPU with =wg) decides whether it can become the default.
# Run from the repo root with kernels.test, engine.test and tilert built from this branch in .device/next/ (xz'd or
# not; the lead's usual build line, docs/measured/next/run.sh). ~4-5 min warm; each step has its own timeout.
set -x
if ls .device/next/*.xz >/dev/null 2>&1; then (cd .device/next && for f in *.xz; do xz -d -f "$f"; done); fi
chmod +x .device/next/* 2>/dev/null
D=$PWD/.device/next
R=/tmp/idxf8; rm -rf $R; mkdir -p $R
export TILERT_KERNEL_CACHE=/tmp/tilert-kernels
save() { tar czf $OUT/idxf8.tgz -C $R .; cp $R/summary.txt $OUT/summary.txt 2>/dev/null; }
# 1. Correctness first: each e4m3 instruction's accumulation (ACCUM lines: crafted 2^8 + 2^(8-j) cases and random
#    products vs exact sums, beside the f16 path), the scores vs the float64 codes with the tolerance derived from it, vs _pf
#    (SCORES: bit-identical share), histogram vs its own scores, the top-2048 vs _pf's and the exact scores'
#    (SELECTION, 8192 and 131072 keys), the rows kernel vs one launch per row. Warms the NVRTC cache.
(cd cuda/kernels && timeout 170 $D/kernels.test -test.run 'TestKernelIndexerF8$' -test.v > $R/kernels.log 2>&1; echo "rc=$?" >> $R/kernels.log)
grep -E "ACCUM|SCORES|SELECTION|score tolerance|^--- |^rc=|FAIL" $R/kernels.log | sed 's/^ *//' | tee -a $R/summary.txt; save
# 2. Timing, graph-timed (cold keys over 4 copies): _pf vs f8 vs wg, scores + hist and the pair with the engine's top-k,
#    1 and 4 rows at 8192, 32768, 131072.
(cd cuda/kernels && TILERT_GPU_TIMING=1 timeout 100 $D/kernels.test -test.run 'TestKernelTimingIdxF8$' -test.v > $R/timing.log 2>&1; echo "rc=$?" >> $R/timing.log)
grep -E "graph: |copy|^rc=" $R/timing.log | sed 's/^ *//' | tee -a $R/summary.txt; save
# 3. Decode step, switch off then =wg (DeepSeek-V3.2 dims, 9 layers, 1 slot, 8192 and 131072).
bn() { local n=$1 t=$2; shift 2; env "$@" timeout $t $D/tilert bench decode --device cuda --dummy-weights deepseek-v3.2 --layers 9 --context 8192,131072 --batches 1 --json $R/$n.json > $R/$n.txt 2>&1; echo "rc=$?" >> $R/$n.txt; grep -A3 "p50 ms" $R/$n.txt | sed "s/^/$n $* /" >> $R/summary.txt; save; }
bn idx-off 100
bn idx-wg 60 TILERT_GPU_IDX_F8=wg
# 4. Greedy tokens on the trained tiny models equal the CPU engine's with the scores on f8 (=1) and on wg (=wg),
#    and the kernel ran.
(cd engine/gpu && timeout 150 $D/engine.test -test.run 'TestGPUIdxF8$' -test.v > $R/engine.log 2>&1; echo "rc=$?" >> $R/engine.log)
grep -E "^ *--- |^rc=|launches" $R/engine.log 2>/dev/null | tail -8 | tee -a $R/summary.txt; save
# 5. If time is left: the step with the mma.sync kernel too (predicted slower).
[ $SECONDS -lt 300 ] && bn idx-f8 60 TILERT_GPU_IDX_F8=1
