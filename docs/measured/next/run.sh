# The whole gpu-check (RAN in session 12 as docs/measured/h200-2026-12-02-s12 calls C-D, split in two). Session 11 (docs/measured/h200-2026-12-02-s11)
# made side streams with capped side GEMVs and programmatic launches the engine's default (2.916 -> 2.764 ms at
# 8192, 1 slot) after the whole ENGINE part of gpu-check passed with them (call D); the kernel checks were not
# re-run (no kernel changed). Next, in order:
#  A. this file: the whole default gpu-check, unnarrowed (~450-550 s on a fresh machine: the NVRTC cache is cold).
#  B. docs/measured/next/sweep.sh (~360 s): TILERT_GPU_SIDE_MOE=route, TILERT_GPU_PDL_MORE=1 (the MLA, absorbs, top-k and mid GEMVs launched
#     programmatically too) and NORM_FUSE=1 under the new defaults, GLM-5 too, and the engine checks with
#     PDL_MORE=1. If it wins and passes, make it the default (pdlFor) and run the whole gpu-check again.
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
