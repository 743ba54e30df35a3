# Session 10 call C (main with helper flow's moe_flow merged opt-in, helper hsplit's header split (every kernel's
# PTX unchanged, checked here with nvcc and NVRTC), absorb_fast on by default):
#  1. helper flow's fragment docs/measured/next8/flow.sh (its 90 s raised to 130 s so the bench pair runs);
#  2. the engine checks with absorb on by default (every TestGPU test but the prefill-only ones, whose one-row
#     decode steps are a few of the same launches), the decode hand-off;
#  3. the issue-10 table for DeepSeek-V3.2 dims with today's defaults, and the shard timing.
set -x
cd .device/next && for f in *.xz; do xz -d -f "$f"; done; chmod +x *; cd ../..
D=$PWD/.device/next
R=$OUT/c; rm -rf $R; mkdir -p $R/gc   # straight under $OUT: whatever a cap cuts still comes back
export TILERT_KERNEL_CACHE=/tmp/tilert-kernels
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv > $R/smi.txt 2>&1
sed 's/90 - (SECONDS - fl_t0)/130 - (SECONDS - fl_t0)/g' docs/measured/next8/flow.sh > /tmp/flow130.sh
source /tmp/flow130.sh
TILERT_GPU_TIMING=0 GPU_CHECK_NOBUILD=1 GPU_TEST_BIN=$D/kernels.test ENGINE_TEST_BIN=$D/engine.test \
  DECODE_TEST_BIN=$D/decode.test CUDA_TEST_BIN=$D/cuda.test OUT=$R/gc GPU_CHECK_RUN='^TestNVRTCCompilesAbsorbKernels$' \
  ENGINE_CHECK_RUN='^TestGPU([^PM]|P[^r]|M[^L]|Pre[^f]|MLAPrefillGreedy)' \
  timeout 150 scripts/gpu-check.sh > $R/gpu-check.txt 2>&1
echo "gpu-check rc=$?" >> $R/gpu-check.txt
timeout 50 $D/tilert bench decode --device cuda --dummy-weights deepseek-v3.2 --layers 9 --context 8192,131072 \
  --batches 1,4 --json $R/bench-ds.json > $R/bench-ds.txt 2>&1; echo rc=$? >> $R/bench-ds.txt
(cd engine/gpu && TILERT_GPU_TIMING=1 timeout 25 $D/engine.test -test.run 'TestGPUShardLayerTiming$' -test.v > $R/shard.log 2>&1; echo "rc=$?" >> $R/shard.log)
grep -h "rc=\|fl_ok" $R/flow/*.log $R/flow/*.txt | sort | uniq -c; grep -hE "graph|us " $R/flow/timing.log | grep -i "flow\|chain\|persist" | cut -c1-170 | head -30
grep -h "moePersist\|graphed" $R/flow/shard-timing*.log | cut -c1-170; grep -A2 "context slots" $R/flow/bench-*.txt
tail -3 $R/gpu-check.txt; grep -h "^--- FAIL" $R/gc/*.log $R/flow/*.log; head -8 $R/bench-ds.txt; grep -h "graphed" $R/shard.log | cut -c1-170
