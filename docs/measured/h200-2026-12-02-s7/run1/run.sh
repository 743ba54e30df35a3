# The device plan for the next session with H200 time (NOT RUN). One call, ~450 s.
# Build from main (repo root):
#   mkdir -p .device/next
#   CGO_ENABLED=0 go test -c -ldflags="-s -w" -trimpath -o .device/next/kernels.test ./cuda/kernels
#   CGO_ENABLED=0 go test -c -ldflags="-s -w" -trimpath -o .device/next/engine.test ./engine/gpu
#   CGO_ENABLED=0 go test -c -ldflags="-s -w" -trimpath -o .device/next/decode.test ./roles/decode
#   CGO_ENABLED=0 go build -ldflags="-s -w" -trimpath -o .device/next/tilert . && gzip -9 .device/next/*
# then carry [".device/next"] and run `bash docs/measured/next/run.sh` (each step tars $R into $OUT).
set -x
cd .device/next && gunzip -f *.gz; chmod +x *; cd ../..
D=$PWD/.device/next
R=/tmp/next; mkdir -p $R/gc
export TILERT_KERNEL_CACHE=/tmp/tilert-kernels
step() { tar czf $OUT/$1.tgz -C $R . ; }
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv > $R/smi.txt 2>&1
CAND="TILERT_GPU_GEMM=1 TILERT_GPU_ABSORB_TC=1 TILERT_GPU_MLA_PREFILL=2"
# 1. the prefill benches first (they also fill the NVRTC cache): today's default, the candidates, the one-part switches
i=0
for e in "" "$CAND" "$CAND TILERT_GPU_GEMM_SPLITS=1" "TILERT_GPU_GEMM=1 TILERT_GPU_ABSORB_TC=1 TILERT_GPU_MLA_PREFILL=4 TILERT_GPU_GEMM_SPLITS=1"; do
  i=$((i+1)); echo "$e" > $R/prefill-$i.env
  env $e timeout 40 $D/tilert bench decode --device cuda --dummy-weights deepseek-v3.2 --layers 1 --prompt-len 8192 --tokens 4 \
    --prefill-lens 1024,8192 --profile --json $R/prefill-$i.json > $R/prefill-$i.txt 2>&1
done
step a
# 2. the whole gpu-check with the candidates as defaults (a longer limit than session 6's 260 s)
env $CAND TILERT_GPU_TIMING=0 GPU_CHECK_NOBUILD=1 GPU_TEST_BIN=$D/kernels.test ENGINE_TEST_BIN=$D/engine.test \
  DECODE_TEST_BIN=$D/decode.test OUT=$R/gc timeout 330 scripts/gpu-check.sh > $R/gpu-check.txt 2>&1
echo "gpu-check rc=$?" >> $R/gpu-check.txt
step b
