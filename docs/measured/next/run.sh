# The device plan for the next session with H200 time (NOT RUN). One call, ~450 s.
# Decides whether the one-part prefill (TILERT_GPU_GEMM_SPLITS=1: gemm_p1 + absorb_p1, and
# TILERT_GPU_MLA_PREFILL=4: mla_prefill_h1; serving mode only) becomes the serving default: the whole
# gpu-check with them in the environment, and the prefill bench against today's default in the same run.
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
CAND="TILERT_GPU_GEMM_SPLITS=1 TILERT_GPU_MLA_PREFILL=4"
# 1. the prefill benches (the first also fills the NVRTC cache: a long limit)
i=0
for e in "" "$CAND"; do
  i=$((i+1)); echo "$e" > $R/prefill-$i.env
  env $e timeout 90 $D/tilert bench decode --device cuda --dummy-weights deepseek-v3.2 --layers 1 --prompt-len 8192 --tokens 4 \
    --prefill-lens 1024,8192 --profile --json $R/prefill-$i.json > $R/prefill-$i.txt 2>&1
done
step a
# 2. the whole gpu-check with the candidates as defaults
env $CAND TILERT_GPU_TIMING=0 GPU_CHECK_NOBUILD=1 GPU_TEST_BIN=$D/kernels.test ENGINE_TEST_BIN=$D/engine.test \
  DECODE_TEST_BIN=$D/decode.test OUT=$R/gc timeout 400 scripts/gpu-check.sh > $R/gpu-check.txt 2>&1
echo "gpu-check rc=$?" >> $R/gpu-check.txt
step b
