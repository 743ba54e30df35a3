set -x; cd .device/async && gunzip -f *.gz && chmod +x * && cd ../.. ; mkdir -p $RES
D=$PWD/.device/async
nvidia-smi > $RES/nvidia-smi.txt 2>&1
# 1. correctness: pipelined == not pipelined over a changing-slots schedule (both presets), the drain points,
#    and with TILERT_GPU_PIPELINE=1 greedy == CPU serving (first test: it also compiles the kernels)
(cd engine/gpu && TILERT_GPU_PIPELINE=1 timeout 62 $D/engine.test -test.v -test.count=1 \
  -test.run '^TestGPUGreedyMatchesCPU$|^TestGPUPipelineMatches$|^TestGPUPipelineDrains$' > $RES/engine.log 2>&1; echo "engine rc=$?" >> $RES/engine.log)
grep -E '^(--- |ok|FAIL|PASS)|ahead_test|engine rc' $RES/engine.log
echo "t=$SECONDS"
# 2. step p50 pipelined (with the host-per-step line) then not pipelined, same binary
left=$((116 - SECONDS)); t1=$(( left > 70 ? left / 2 + 6 : left - 30 ))
TILERT_GPU_PIPELINE=1 timeout $t1 $D/tilert bench decode --device cuda --dummy-weights deepseek-v3.2 --layers 9 --context 8192 --batches 1,4 --profile --json $RES/bench-pipe1.json > $RES/bench-pipe1.txt 2>&1
echo "bench1 rc=$? t=$SECONDS"; grep -v '^    ' $RES/bench-pipe1.txt
left=$((117 - SECONDS))
[ $left -gt 15 ] && TILERT_GPU_PIPELINE=0 timeout $left $D/tilert bench decode --device cuda --dummy-weights deepseek-v3.2 --layers 9 --context 8192 --batches 1,4 --profile --json $RES/bench-pipe0.json > $RES/bench-pipe0.txt 2>&1
echo "bench0 rc=$? t=$SECONDS"; grep -v '^    ' $RES/bench-pipe0.txt
