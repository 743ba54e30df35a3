# Session 10 call A: the whole default `make gpu-check` on main (session 9's defaults: gemv_mid_group for
# q_b + wq_b, topk_fast, mla_decode_few), kernel checks unnarrowed; then the TP-8 shard timing with the
# no-indexer ranks reading rank 0's top-k (the timing test's fix of this session).
set -x
cd .device/next && for f in *.xz; do xz -d -f "$f"; done; chmod +x *; cd ../..
D=$PWD/.device/next
R=/tmp/s10a; rm -rf $R; mkdir -p $R/gc
export TILERT_KERNEL_CACHE=/tmp/tilert-kernels
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv > $R/smi.txt 2>&1
TILERT_GPU_TIMING=0 GPU_CHECK_NOBUILD=1 GPU_TEST_BIN=$D/kernels.test ENGINE_TEST_BIN=$D/engine.test \
  DECODE_TEST_BIN=$D/decode.test CUDA_TEST_BIN=$D/cuda.test OUT=$R/gc timeout 500 scripts/gpu-check.sh > $R/gpu-check.txt 2>&1
echo "gpu-check rc=$?" >> $R/gpu-check.txt
TILERT_GPU_TIMING=1 timeout 60 $D/engine.test -test.run 'TestGPUShardLayerTiming$' -test.v > $R/shard.log 2>&1
echo "rc=$?" >> $R/shard.log
tail -5 $R/gpu-check.txt; grep -c FAIL $R/gc/* 2>/dev/null | head; tail -3 $R/shard.log
tar czf $OUT/a.tgz -C $R .
