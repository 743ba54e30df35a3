# Session 14 call A (binaries of main 52ee8c9): the side stream's kernels now launch plainly by default
# (TILERT_GPU_SIDE_PDL=1 goes back). The engine, decode-node and cuda parts of gpu-check with that default, then
# both models' issue-10 tables (8192 and 131072, 1 and 4 slots), then an A/B at 131072 (call A of session 13 measured
# only 8192). Prediction: the tables' 8192/1-slot rows ~2.70 ms (DeepSeek) and ~2.92 (GLM-5).
set -x
cd .device/next && for f in *.xz; do xz -d -f "$f"; done; chmod +x *; cd ../..
D=$PWD/.device/next
R=/tmp/s14a; rm -rf $R; mkdir -p $R/gc
export TILERT_KERNEL_CACHE=/tmp/tilert-kernels
TILERT_GPU_TIMING=0 GPU_CHECK_NOBUILD=1 GPU_CHECK_RUN='^$' GPU_TEST_BIN=$D/kernels.test ENGINE_TEST_BIN=$D/engine.test \
  DECODE_TEST_BIN=$D/decode.test CUDA_TEST_BIN=$D/cuda.test OUT=$R/gc timeout 330 scripts/gpu-check.sh > $R/gpu-check.txt 2>&1
echo "gpu-check rc=$?" >> $R/gpu-check.txt
tail -8 $R/gpu-check.txt
tar czf $OUT/a.tgz -C $R .
timeout 75 $D/tilert bench decode --device cuda --dummy-weights deepseek-v3.2 --layers 9 --context 8192,131072 --batches 1,4 --json $R/bench-ds.json > $R/bench-ds.txt 2>&1; echo "rc=$?" >> $R/bench-ds.txt
tail -7 $R/bench-ds.txt
tar czf $OUT/a.tgz -C $R .
timeout 70 $D/tilert bench decode --device cuda --dummy-weights glm-5 --layers 9 --context 8192,131072 --batches 1,4 --json $R/bench-glm.json > $R/bench-glm.txt 2>&1; echo "rc=$?" >> $R/bench-glm.txt
tail -7 $R/bench-glm.txt
tar czf $OUT/a.tgz -C $R .
bn() { local n=$1 t=$2; shift 2; env "$@" timeout $t $D/tilert bench decode --device cuda --dummy-weights deepseek-v3.2 --layers 9 --context 131072 --batches 1 --json $R/$n.json > $R/$n.txt 2>&1; echo "rc=$?" >> $R/$n.txt; grep -A1 "p50 ms" $R/$n.txt | tail -1 | sed "s/^/$n $* /" >> $R/summary.txt; cp $R/summary.txt $OUT/summary.txt; }
bn sidepdl1 35 TILERT_GPU_SIDE_PDL=1
bn default 35
tar czf $OUT/a.tgz -C $R .
