# The lead's final run for the next session with a device (NOT RUN: session 3's device was withdrawn
# after round 1). Merged main has four default changes that each ran only against its own switch
# (pipelined step, SMALL kernels, one-block top-k, 2..8-row tensor-core GEMVs) and never together,
# and no full gpu-check since 34d5aca. ~480 s on one H200. Build from merged main (repo root):
#   mkdir -p .device/final
#   CGO_ENABLED=0 go test -c -ldflags="-s -w" -trimpath -o .device/final/kernels.test ./cuda/kernels
#   CGO_ENABLED=0 go test -c -ldflags="-s -w" -trimpath -o .device/final/engine.test ./engine/gpu
#   CGO_ENABLED=0 go test -c -ldflags="-s -w" -trimpath -o .device/final/decode.test ./roles/decode
#   CGO_ENABLED=0 go build -ldflags="-s -w" -trimpath -o .device/final/tilert . && gzip -9 .device/final/*
# then carry [".device/final"] and run `bash docs/measured/next/run.sh` (it tars each step into $OUT).
set -x
cd .device/final && gunzip -f *.gz; chmod +x *; cd ../..
D=$PWD/.device/final
R=/tmp/final; mkdir -p $R/gc
export TILERT_KERNEL_CACHE=/tmp/tilert-kernels
step() { tar czf $OUT/$1.tgz -C $R . ; }
# 1. full gpu-check on merged main's defaults (every kernel vs its CPU reference, engine incl. the
#    pipelined step's tests, decode hand-off); timing tables off here
TILERT_GPU_TIMING=0 GPU_CHECK_NOBUILD=1 GPU_TEST_BIN=$D/kernels.test ENGINE_TEST_BIN=$D/engine.test DECODE_TEST_BIN=$D/decode.test OUT=$R/gc timeout 230 scripts/gpu-check.sh > $R/gpu-check.txt 2>&1; echo "gpu-check rc=$?" >> $R/gpu-check.txt
step a
# 2. the 2..8-row GEMVs on every shape in the engine checks (the defaults never reach them on the tiny presets)
(cd engine/gpu && TILERT_GPU_GEMV_MMA=all timeout 60 $D/engine.test -test.count=1 -test.run 'TestGPUGreedyMatchesCPU$|TestGPUCachesMatchCPU|TestGPULogitsMatchEmulator|TestGPUPipelineMatches' > $R/engine-mma-all.log 2>&1; echo rc=$? >> $R/engine-mma-all.log)
step b
# 3. step tables (defaults), then each session-3 switch off in the same run
timeout 70 $D/tilert bench decode --device cuda --dummy-weights deepseek-v3.2 --layers 9 --context 8192,131072 --batches 1,4 --profile --json $R/bench-ds.json > $R/bench-ds.txt 2>&1
step c
timeout 50 $D/tilert bench decode --device cuda --dummy-weights glm-5 --layers 9 --context 8192,131072 --batches 1,4 --json $R/bench-glm.json > $R/bench-glm.txt 2>&1
timeout 40 $D/tilert bench decode --device cuda --dummy-weights deepseek-v3.2 --layers 9 --context 8192 --batches 1 --mtp --json $R/bench-ds-mtp.json > $R/bench-ds-mtp.txt 2>&1
TILERT_GPU_PIPELINE=0 TILERT_GPU_SMALL=0 TILERT_GPU_TOPK_ONE=0 TILERT_GPU_GEMV_MMA=0 timeout 45 $D/tilert bench decode --device cuda --dummy-weights deepseek-v3.2 --layers 9 --context 8192 --batches 1,4 --json $R/bench-ds-s2.json > $R/bench-ds-s2.txt 2>&1
timeout 40 $D/tilert bench decode --device cuda --dummy-weights deepseek-v3.2 --layers 1 --context 1024,8192 --batches 1 --profile --json $R/bench-l1.json > $R/bench-l1.txt 2>&1
step d
# 4. TP-8 shard timing (issue 11)
(cd engine/gpu && TILERT_GPU_TIMING=1 TILERT_SHARD_REPORT=$R/shard-timing.txt timeout 50 $D/engine.test -test.v -test.count=1 -test.run 'TestGPUShardLayerTiming' 2>&1 | head -c 30000 > $R/shard-timing.log)
step e
# 5. HF comparison (decode ratio and prefill)
PYTHONUNBUFFERED=1 timeout 150 python3 scripts/hf_bench.py --tilert $D/tilert --preset deepseek-v3.2-moe --model-dir /tmp/ds-moe --contexts 1024,8192 --tokens 32 --json $R/hf-bench.json > $R/hf-bench.log 2>&1
step f
