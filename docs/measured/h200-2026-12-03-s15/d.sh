# Session 15 call D (binaries of main 6c08a11): the engine, decode-node and cuda parts of gpu-check with today's
# defaults (GLM-5's o_proj spread, launched plainly; FUSE=2|3 and the two indexer variants removed), then the
# issue-10 tables at 1 slot (8192 and 131072) for both models, then plain launches of three families that launch
# programmatically today (TILERT_GPU_PDL_PLAIN), DeepSeek-V3.2 dims at 8192: call C found GLM-5's o_proj faster
# launched plainly. Prediction: DeepSeek 8192 ~2.69 ms, GLM-5 8192 ~2.86.
set -x
cd .device/next && for f in *.xz; do xz -d -f "$f"; done; chmod +x *; cd ../..
D=$PWD/.device/next
R=/tmp/s15d; rm -rf $R; mkdir -p $R/gc
export TILERT_KERNEL_CACHE=/tmp/tilert-kernels
TILERT_GPU_TIMING=0 GPU_CHECK_NOBUILD=1 GPU_CHECK_RUN='^$' GPU_TEST_BIN=$D/kernels.test ENGINE_TEST_BIN=$D/engine.test \
  DECODE_TEST_BIN=$D/decode.test CUDA_TEST_BIN=$D/cuda.test OUT=$R/gc timeout 340 scripts/gpu-check.sh > $R/gpu-check.txt 2>&1
echo "gpu-check rc=$?" >> $R/gpu-check.txt
tail -12 $R/gpu-check.txt
tar czf $OUT/d.tgz -C $R .
for m in deepseek-v3.2 glm-5; do
  timeout 50 $D/tilert bench decode --device cuda --dummy-weights $m --layers 9 --context 8192,131072 --batches 1 --json $R/bench-$m.json > $R/bench-$m.txt 2>&1; echo "rc=$?" >> $R/bench-$m.txt
  tail -4 $R/bench-$m.txt; tar czf $OUT/d.tgz -C $R .
done
bn() { local n=$1; shift; env "$@" timeout 30 $D/tilert bench decode --device cuda --dummy-weights deepseek-v3.2 --layers 9 --context 8192 --batches 1 > $R/$n.txt 2>&1; echo "rc=$?" >> $R/$n.txt; grep -A1 "p50 ms" $R/$n.txt | tail -1 | sed "s/^/$n $* /" | tee -a $R/summary.txt; tar czf $OUT/d.tgz -C $R .; }
bn plain-d16 TILERT_GPU_PDL_PLAIN=gemv_tile_fp8_r8_m1_d16
bn plain-group TILERT_GPU_PDL_PLAIN=gemv_group
bn plain-moe TILERT_GPU_PDL_PLAIN=moe_
bn base
