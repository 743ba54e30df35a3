# Session 12 call D: the kernel checks of gpu-check (cuda binding + cuda/kernels, unnarrowed), last run whole in
# session 10; no kernel's code changed since (session 11 removed moe_persist and added the tile-grid cap).
set -x
cd .device/next && for f in *.xz; do xz -d -f "$f"; done; chmod +x *; cd ../..
D=$PWD/.device/next
R=/tmp/s12d; rm -rf $R; mkdir -p $R/gc
export TILERT_KERNEL_CACHE=/tmp/tilert-kernels
TILERT_GPU_TIMING=0 GPU_CHECK_NOBUILD=1 ENGINE_CHECK_RUN=skip DECODE_CHECK_RUN=skip GPU_TEST_BIN=$D/kernels.test ENGINE_TEST_BIN=$D/engine.test \
  DECODE_TEST_BIN=$D/decode.test CUDA_TEST_BIN=$D/cuda.test OUT=$R/gc timeout 330 scripts/gpu-check.sh > $R/gpu-check.txt 2>&1
echo "gpu-check rc=$?" >> $R/gpu-check.txt
grep -c "^--- PASS" $R/gc/gpu-test.log; grep "^--- FAIL" $R/gc/gpu-test.log | head; tail -6 $R/gpu-check.txt
tar czf $OUT/d.tgz -C $R .
