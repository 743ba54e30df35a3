# Session 7's device plan, call A: the side stream (TILERT_GPU_SIDE=1, engine/gpu/side.go) measured
# against one stream in the same run, then the whole gpu-check with it on (and the prefill defaults
# flipped this session: GEMMs, absorb_tc, mla_prefill_tcp). ~520 s.
# Build from the tree (repo root):
#   mkdir -p .device/next
#   CGO_ENABLED=0 go test -c -ldflags="-s -w" -trimpath -o .device/next/kernels.test ./cuda/kernels
#   CGO_ENABLED=0 go test -c -ldflags="-s -w" -trimpath -o .device/next/engine.test ./engine/gpu
#   CGO_ENABLED=0 go test -c -ldflags="-s -w" -trimpath -o .device/next/decode.test ./roles/decode
#   CGO_ENABLED=0 go build -ldflags="-s -w" -trimpath -o .device/next/tilert . && gzip -9 .device/next/*
# then carry [".device/next"] and run `bash docs/measured/next3/run.sh`.
set -x
cd .device/next && gunzip -f *.gz; chmod +x *; cd ../..
D=$PWD/.device/next
R=/tmp/next3; mkdir -p $R/gc
export TILERT_KERNEL_CACHE=/tmp/tilert-kernels
step() { tar czf $OUT/$1.tgz -C $R . ; }
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv > $R/smi.txt 2>&1
# 1. decode steps, DeepSeek-V3.2 dims, 9 MoE layers: one stream, then the side stream; GLM-5 with it; the profile
for s in 0 1; do
  TILERT_GPU_SIDE=$s timeout 60 $D/tilert bench decode --device cuda --dummy-weights deepseek-v3.2 --layers 9 \
    --context 8192,131072 --batches 1,4 --json $R/bench-ds-side$s.json > $R/bench-ds-side$s.txt 2>&1
done
TILERT_GPU_SIDE=1 timeout 45 $D/tilert bench decode --device cuda --dummy-weights glm-5 --layers 9 \
  --context 8192,131072 --batches 1,4 --json $R/bench-glm-side1.json > $R/bench-glm-side1.txt 2>&1
TILERT_GPU_SIDE=1 timeout 60 $D/tilert bench decode --device cuda --dummy-weights deepseek-v3.2 --layers 9 \
  --context 8192 --batches 1 --profile --json $R/bench-ds-side1-profile.json > $R/bench-ds-side1-profile.txt 2>&1
step a
# 2. the whole gpu-check with the side stream on (TestGPUSideStreamSameTokens compares on and off itself;
#    TestKernelGemvTile checks the split, shaped expert launches bit for bit)
TILERT_GPU_SIDE=1 TILERT_GPU_TIMING=0 GPU_CHECK_NOBUILD=1 GPU_TEST_BIN=$D/kernels.test ENGINE_TEST_BIN=$D/engine.test \
  DECODE_TEST_BIN=$D/decode.test OUT=$R/gc timeout 330 scripts/gpu-check.sh > $R/gpu-check.txt 2>&1
echo "gpu-check rc=$?" >> $R/gpu-check.txt
step b
