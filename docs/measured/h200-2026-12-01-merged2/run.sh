set -x
cd .device/final && gunzip -f *.gz; chmod +x *; cd ../..
D=$PWD/.device/final
R=/tmp/final; mkdir -p $R/gc
export TILERT_KERNEL_CACHE=/tmp/tilert-kernels
step() { tar czf $OUT/$1.tgz -C $R . ; }
# 1. full gpu-check on merged main (every kernel vs its CPU reference, engine, decode handoff); timing tables off here
TILERT_GPU_TIMING=0 GPU_CHECK_NOBUILD=1 GPU_TEST_BIN=$D/kernels.test ENGINE_TEST_BIN=$D/engine.test DECODE_TEST_BIN=$D/decode.test OUT=$R/gc timeout 210 scripts/gpu-check.sh > $R/gpu-check.txt 2>&1; echo "gpu-check rc=$?" >> $R/gpu-check.txt
step a
# 2. step tables
timeout 70 $D/tilert bench decode --device cuda --dummy-weights deepseek-v3.2 --layers 9 --context 8192,131072 --batches 1,4 --profile --json $R/bench-ds.json > $R/bench-ds.txt 2>&1
step b
timeout 50 $D/tilert bench decode --device cuda --dummy-weights glm-5 --layers 9 --context 8192,131072 --batches 1,4 --json $R/bench-glm.json > $R/bench-glm.txt 2>&1
timeout 40 $D/tilert bench decode --device cuda --dummy-weights deepseek-v3.2 --layers 9 --context 8192 --batches 1 --mtp --json $R/bench-ds-mtp.json > $R/bench-ds-mtp.txt 2>&1
step c
# 3. TP-8 shard timing (issue 11)
(cd engine/gpu && TILERT_GPU_TIMING=1 TILERT_SHARD_REPORT=$R/shard-timing.txt timeout 45 $D/engine.test -test.v -test.count=1 -test.run 'TestGPUShardLayerTiming' > $R/shard-timing.log 2>&1)
# 4. the grouped projections off, same run
TILERT_GPU_GROUP=0 timeout 35 $D/tilert bench decode --device cuda --dummy-weights deepseek-v3.2 --layers 9 --context 8192 --batches 1 --json $R/bench-ds-group0.json > $R/bench-ds-group0.txt 2>&1
step d
# 5. HF comparison
PYTHONUNBUFFERED=1 timeout 150 python3 scripts/hf_bench.py --tilert $D/tilert --preset deepseek-v3.2-moe --model-dir /tmp/ds-moe --contexts 1024,8192 --tokens 32 --json $R/hf-bench.json > $R/hf-bench.log 2>&1
step e
