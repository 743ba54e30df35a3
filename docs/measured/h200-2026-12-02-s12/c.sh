# Session 12 call C: the engine and decode-node parts of gpu-check with the new default (TILERT_GPU_PDL_MORE unset =
# mla_decode_tcf,gemv_mid,absorb_v launched programmatically; call B measured each alone at -8, -6, -2 us a step),
# then DeepSeek-V3.2's issue-10 table in one command and the A/B at 8192, 1 slot (TILERT_GPU_PDL_MORE=0 = session 11).
# Prediction: ~-15 us a step (2.757 -> ~2.742 ms).
set -x
cd .device/next && for f in *.xz; do xz -d -f "$f"; done; chmod +x *; cd ../..
D=$PWD/.device/next
R=/tmp/s12c; rm -rf $R; mkdir -p $R/gc
export TILERT_KERNEL_CACHE=/tmp/tilert-kernels
TILERT_GPU_TIMING=0 GPU_CHECK_NOBUILD=1 GPU_CHECK_RUN='^$' GPU_TEST_BIN=$D/kernels.test ENGINE_TEST_BIN=$D/engine.test \
  DECODE_TEST_BIN=$D/decode.test CUDA_TEST_BIN=$D/cuda.test OUT=$R/gc timeout 360 scripts/gpu-check.sh > $R/gpu-check.txt 2>&1
echo "gpu-check rc=$?" >> $R/gpu-check.txt
tail -8 $R/gpu-check.txt
timeout 120 $D/tilert bench decode --device cuda --dummy-weights deepseek-v3.2 --layers 9 --context 8192,131072 --batches 1,4 --json $R/bench-ds.json > $R/bench-ds.txt 2>&1; echo "rc=$?" >> $R/bench-ds.txt
cat $R/bench-ds.txt | tail -7
bn() { local n=$1 t=$2; shift 2; env "$@" timeout $t $D/tilert bench decode --device cuda --dummy-weights deepseek-v3.2 --layers 9 --context 8192 --batches 1 --json $R/$n.json > $R/$n.txt 2>&1; echo "rc=$?" >> $R/$n.txt; grep -A1 "p50 ms" $R/$n.txt | tail -1 | sed "s/^/$n $* /" >> $R/summary.txt; cp $R/summary.txt $OUT/summary.txt; }
bn more0 45 TILERT_GPU_PDL_MORE=0
bn default 45
bn more0-2 45 TILERT_GPU_PDL_MORE=0
bn default2 45
tar czf $OUT/c.tgz -C $R .
