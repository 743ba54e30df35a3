set -x; cd .device/lead && gunzip -f *.gz && chmod +x * && cd ../.. ; mkdir -p $RES
D=$PWD/.device/lead
(cd cuda/kernels && timeout 60 $D/kernels.test -test.v -test.count=1 -test.run 'TestKernelIndexer$|TestKernelMLA$' 2>&1 | tail -40 > $RES/kernels-idx.txt)
(cd engine/gpu && TILERT_GPU_TIMING=1 TILERT_SHARD_REPORT=$RES/shard-timing.txt timeout 50 $D/engine.test -test.v -test.count=1 -test.run 'TestGPUShardLayerTiming' 2>&1 | head -c 20000 > $RES/shard-timing.log)
timeout 50 $D/tilert bench decode --device cuda --dummy-weights deepseek-v3.2 --layers 1 --context 1024,8192 --batches 1 --profile --json $RES/bench-l1.json > $RES/bench-l1.txt 2>&1
