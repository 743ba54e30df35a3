# Session 15 call D (binaries of main 6c08a11): the issue-10 tables, 1 slot (8192 and 131072), both models, with
# today's defaults (GLM-5's o_proj spread, launched plainly; the removals of FUSE=2|3 and the two indexer variants),
# then the engine, decode-node and cuda parts of gpu-check. Prediction: DeepSeek 8192 ~2.69 ms, GLM-5 8192 ~2.86.
set -x
cd .device/next && for f in *.xz; do xz -d -f "$f"; done; chmod +x *; cd ../..
D=$PWD/.device/next
R=/tmp/s15d; rm -rf $R; mkdir -p $R/gc
export TILERT_KERNEL_CACHE=/tmp/tilert-kernels
for m in deepseek-v3.2 glm-5; do
  timeout 60 $D/tilert bench decode --device cuda --dummy-weights $m --layers 9 --context 8192,131072 --batches 1 --json $R/bench-$m.json > $R/bench-$m.txt 2>&1; echo "rc=$?" >> $R/bench-$m.txt
  tail -5 $R/bench-$m.txt; tar czf $OUT/d.tgz -C $R .
done
TILERT_GPU_TIMING=0 GPU_CHECK_NOBUILD=1 GPU_CHECK_RUN='^$' GPU_TEST_BIN=$D/kernels.test ENGINE_TEST_BIN=$D/engine.test \
  DECODE_TEST_BIN=$D/decode.test CUDA_TEST_BIN=$D/cuda.test OUT=$R/gc timeout 360 scripts/gpu-check.sh > $R/gpu-check.txt 2>&1
echo "gpu-check rc=$?" >> $R/gpu-check.txt
tail -12 $R/gpu-check.txt
tar czf $OUT/d.tgz -C $R .
