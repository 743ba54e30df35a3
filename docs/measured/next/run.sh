# The device plan for the next session with H200 time (NOT RUN). Session 8 spent its 30 minutes on runs 1-5
# (docs/measured/h200-2026-12-02-s8); two tries of a call were lost to the device pool. Two calls:
#  A. ran in session 9 (call A): `bash docs/measured/next5/run6.sh` (helper pdlw's TILERT_GPU_PDL=2) and helper
#     gbulk's fragment (TILERT_GPU_GEMV_BULK=1). Both correct, neither faster; both removed since (helper prune;
#     outcomes in cuda/kernels/NOTES.md "PDL mode 2 (pdlw)" and "Bulk-copy GEMV").
#  B. this file (~450 s): the whole default gpu-check on main, which since session 8 also runs the cuda binding's
#     device tests (Do after a Goexit), mla_prefill_wg / wg2's kernel checks (no longer opt-in), TestGPUFastPrefill
#     (--prefill-precision fast == the pinned one-part switches, wg2 launched), wg2's engine checks, and the
#     default prefill after helper pgap's MoE reordering; then the HF comparison in the same call if time is left.
# Build from main (repo root):
#   mkdir -p .device/next
#   for p in kernels:./cuda/kernels engine:./engine/gpu decode:./roles/decode cuda:./cuda; do
#     CGO_ENABLED=0 go test -c -ldflags="-s -w" -trimpath -o .device/next/${p%%:*}.test ${p#*:}; done
#   CGO_ENABLED=0 go build -ldflags="-s -w" -trimpath -o .device/next/tilert . && gzip -9 .device/next/*
# then carry [".device/next"] (the working tree plus carry must stay under 64 MiB).
set -x
cd .device/next && gunzip -f *.gz; chmod +x *; cd ../..
D=$PWD/.device/next
R=/tmp/next; rm -rf $R; mkdir -p $R/gc   # the device keeps /tmp between sessions: start empty
export TILERT_KERNEL_CACHE=/tmp/tilert-kernels
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv > $R/smi.txt 2>&1
TILERT_GPU_TIMING=0 GPU_CHECK_NOBUILD=1 GPU_TEST_BIN=$D/kernels.test ENGINE_TEST_BIN=$D/engine.test \
  DECODE_TEST_BIN=$D/decode.test CUDA_TEST_BIN=$D/cuda.test OUT=$R/gc timeout 540 scripts/gpu-check.sh > $R/gpu-check.txt 2>&1
echo "gpu-check rc=$?" >> $R/gpu-check.txt
tar czf $OUT/b.tgz -C $R .
