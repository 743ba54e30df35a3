# The device plan for the next session with H200 time (NOT RUN). Session 10 (docs/measured/h200-2026-12-02-s10)
# ran the whole gpu-check with session 9's defaults (calls A + B: PASS), made the one-row absorb kernels the default
# (TILERT_GPU_ABSORB_FAST) after the core engine checks passed with them (call C), and measured and removed the
# dataflow MoE kernel (moe_flow). Next, in order:
#  A. this file (~450-550 s on a fresh machine: the NVRTC cache is cold there, the kernel checks alone took 343 s):
#     the whole default gpu-check, unnarrowed, with absorb on by default (call C ran only the core engine tests).
#  B. the issue-10 tables with today's defaults, one command each (README "Against the floor"), ~45 s each:
#     tilert bench decode --device cuda --dummy-weights deepseek-v3.2 --layers 9 --context 8192,131072 --batches 1,4 --profile
#     tilert bench decode --device cuda --dummy-weights glm-5 --layers 9 --context 8192,131072 --batches 1,4
# Device budget facts (session 10): a refused machine start still costs ~90 s of device time; results written
# straight under $OUT come back even when a cap cuts the call, but not more than a few dozen files: tar them.
# Test binaries must run from their package directory (cd engine/gpu && $D/engine.test ...).
# Build from main (repo root):
#   mkdir -p .device/next
#   for p in kernels:./cuda/kernels engine:./engine/gpu decode:./roles/decode cuda:./cuda; do
#     CGO_ENABLED=0 go test -c -ldflags="-s -w" -trimpath -o .device/next/${p%%:*}.test ${p#*:}; done
#   CGO_ENABLED=0 go build -ldflags="-s -w" -trimpath -o .device/next/tilert . && xz -9e -T2 .device/next/*
# then carry [".device/next"] (the working tree plus carry must stay under 64 MiB).
set -x
cd .device/next && for f in *.xz; do xz -d -f "$f"; done; chmod +x *; cd ../..
D=$PWD/.device/next
R=/tmp/next; rm -rf $R; mkdir -p $R/gc   # the device keeps /tmp between sessions: start empty
export TILERT_KERNEL_CACHE=/tmp/tilert-kernels
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv > $R/smi.txt 2>&1
TILERT_GPU_TIMING=0 GPU_CHECK_NOBUILD=1 GPU_TEST_BIN=$D/kernels.test ENGINE_TEST_BIN=$D/engine.test \
  DECODE_TEST_BIN=$D/decode.test CUDA_TEST_BIN=$D/cuda.test OUT=$R/gc timeout 560 scripts/gpu-check.sh > $R/gpu-check.txt 2>&1
echo "gpu-check rc=$?" >> $R/gpu-check.txt
tar czf $OUT/b.tgz -C $R .
