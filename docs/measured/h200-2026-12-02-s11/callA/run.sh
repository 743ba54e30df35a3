# Session 11 call A: where the graphed step's time goes. bench --profile now also times the step's graphs with
# each profile row left out ("in graph": that row's share of the critical path); the TP-8 shard timing prints
# the same column. DeepSeek-V3.2 and GLM-5 dims, 9 MoE layers, 8192, 1 slot; then the shard.
set -x
cd .device/next && for f in *.xz; do xz -d -f "$f"; done; chmod +x *; cd ../..
D=$PWD/.device/next
R=$OUT
export TILERT_KERNEL_CACHE=/tmp/tilert-kernels
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv > $R/smi.txt 2>&1
timeout 150 $D/tilert bench decode --device cuda --dummy-weights deepseek-v3.2 --layers 9 --context 8192 --batches 1 --profile --json $R/ds.json > $R/ds.txt 2>&1; echo "rc=$?" >> $R/ds.txt
(cd engine/gpu && TILERT_GPU_TIMING=1 timeout 120 $D/engine.test -test.run 'TestGPUShardLayerTiming$' -test.v > $R/shard.log 2>&1; echo "rc=$?" >> $R/shard.log)
timeout 100 $D/tilert bench decode --device cuda --dummy-weights glm-5 --layers 9 --context 8192 --batches 1 --profile --json $R/glm.json > $R/glm.txt 2>&1; echo "rc=$?" >> $R/glm.txt
tail -40 $R/ds.txt; tail -50 $R/shard.log
