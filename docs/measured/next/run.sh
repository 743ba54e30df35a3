# The device plan for the next session with H200 time (NOT RUN). Session 9 ran this file's whole gpu-check on
# 8924ce8 (call B, PASS) and then made three kernels default after a narrowed gpu-check with them in the
# environment (call D: the new modules' kernel checks, every engine test, the hand-off); docs/measured/h200-2026-12-02-s9.
# Next, in order:
#  A. this file (~450 s): the whole default gpu-check on main (the defaults of session 9: gemv_mid_group for
#     q_b + wq_b, topk_fast, mla_decode_few), kernel checks unnarrowed.
#  B. the issue-10 table with today's defaults, one command each (README "Against the floor"):
#     tilert bench decode --device cuda --dummy-weights deepseek-v3.2 --layers 9 --context 8192,131072 --batches 1,4 --profile
#     tilert bench decode --device cuda --dummy-weights glm-5 --layers 9 --context 8192,131072 --batches 1,4
#     (give each 120 s: a 9-layer bench is 25-40 s a context and the first process compiles the new modules).
#  C. helper absorb's TILERT_GPU_ABSORB_FAST=1 (session 9, merged opt-in, not run): build, `source docs/measured/next7/absorb.sh`
#     (then `AB_PART=bench` for the remaining bench pairs).
#  D. branch pmoe2 (helper pmoe2, session 9, not merged, not run): the persistent MoE half without grid barriers
#     (TILERT_GPU_MOE_PERSIST_V=flow: ticketed tasks, per-slot readiness counters); merge, build,
#     `source docs/measured/next7/pmoe2.sh` (PM2_PART=bench for the bench pairs).
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
