# Session 7's device plan, call C (after call A = run.sh): helper pabs's fragment (one-part absorbs and the
# one-part prefill checked as a whole), the side stream's modes against one stream in the same run, and the
# side stream's engine checks that call A's gpu-check did not reach (its 330 s limit). Build as run.sh says.
set -x
cd .device/next && gunzip -f *.gz; chmod +x *; cd ../..
D=$PWD/.device/next
R=/tmp/next3c; mkdir -p $R
export TILERT_KERNEL_CACHE=/tmp/tilert-kernels
step() { tar czf $OUT/$1.tgz -C $R . ; }
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv > $R/smi.txt 2>&1
# 1. helper pabs's fragment (<= 150 s)
source docs/measured/next3/pabs.sh
step a
# 2. decode steps at 8192, 1 and 4 slots: one stream (first: pays the NVRTC compile), both forks, each alone
for s in 0 1 q moe; do
  t=40; [ $s = 0 ] && t=90
  TILERT_GPU_SIDE=$s timeout $t $D/tilert bench decode --device cuda --dummy-weights deepseek-v3.2 --layers 9 \
    --context 8192 --batches 1,4 --json $R/bench-ds-side$s.json > $R/bench-ds-side$s.txt 2>&1
done
step b
# 3. issue 11's TP-8 shard of one MoE layer at 8192 (latency-bound chains: where two streams should pay most)
for s in 0 1; do
  (cd engine/gpu && TILERT_GPU_SIDE=$s TILERT_GPU_TIMING=1 TILERT_SHARD_REPORT=$R/shard-side$s.txt timeout 40 $D/engine.test -test.v \
    -test.count=1 -test.run 'TestGPUShardLayerTiming' 2>&1 | head -c 30000 > $R/shard-side$s.log)
done
step c
# 4. the side stream's engine checks (the test runs both ways itself) and the greedy / graph checks with it on
(cd engine/gpu && TILERT_ENGINE_REPORT=$R/side-engine-report.txt timeout 90 $D/engine.test -test.count=1 -test.v \
  -test.run 'TestGPUSideStreamSameTokens$' > $R/side-engine.log 2>&1; echo rc=$? >> $R/side-engine.log)
(cd engine/gpu && TILERT_GPU_SIDE=1 TILERT_ENGINE_REPORT=$R/side1-engine-report.txt timeout 60 $D/engine.test -test.count=1 -test.v \
  -test.run 'TestGPUGreedyMatchesCPU$|TestGPUGraphsEqualEager$|TestGPUPipelineMatches$|TestGPUPenaltiesMatchCPU$' > $R/side1-engine.log 2>&1; echo rc=$? >> $R/side1-engine.log)
step d
