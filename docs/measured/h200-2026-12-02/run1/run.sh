# The device plan for the next session with H200 time (NOT RUN: session 4's budget ran out, session 5 had
# none). One command, ~550 s. It decides the defaults the session-4 helpers proposed and that stay opt-in:
# sparse MLA on mla_decode_tcf2 with launches across slots (helper mla), the prefill GEMMs with absorb_tc,
# the one-chunk rule and mla_prefill_tcpi (helper pfill2).
# Build from main (repo root):
#   mkdir -p .device/next
#   CGO_ENABLED=0 go test -c -ldflags="-s -w" -trimpath -o .device/next/kernels.test ./cuda/kernels
#   CGO_ENABLED=0 go test -c -ldflags="-s -w" -trimpath -o .device/next/engine.test ./engine/gpu
#   CGO_ENABLED=0 go test -c -ldflags="-s -w" -trimpath -o .device/next/decode.test ./roles/decode
#   CGO_ENABLED=0 go build -ldflags="-s -w" -trimpath -o .device/next/tilert . && gzip -9 .device/next/*
# then carry [".device/next"] and run `bash docs/measured/next/run.sh` (each step tars its results into $OUT).
# A default flips only where its step's checks all PASS and its bench row is faster in the same run.
set -x
cd .device/next && gunzip -f *.gz; chmod +x *; cd ../..
D=$PWD/.device/next
R=/tmp/next; mkdir -p $R/gc
export TILERT_KERNEL_CACHE=/tmp/tilert-kernels
step() { tar czf $OUT/$1.tgz -C $R . ; }
want() { case ${STEPS:-abcd} in *$1*) return 0;; esac; return 1; }  # STEPS=ab / STEPS=cd: two back-to-back calls
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv > $R/smi.txt 2>&1
# 1. new kernels vs float64 / their CPU references on fresh inputs (also compiles them all through NVRTC 13):
#    mla_decode_tcf (changed tile issue and prologue since its run 1), tcf2, tcf8; mla_prefill_tcp / tcpi
if want a; then
(cd cuda/kernels && TILERT_GPU_REPORT=$R/kernels-report.txt timeout 90 $D/kernels.test -test.count=1 -test.v \
  -test.run 'TestKernelMLATCF$|TestKernelMLA$|TestKernelMLAPrefill$' > $R/kernels.log 2>&1; echo rc=$? >> $R/kernels.log)
(cd cuda/kernels && TILERT_GPU_TIMING=1 TILERT_GPU_REPORT=$R/kernels-timing.txt timeout 30 $D/kernels.test -test.count=1 -test.v \
  -test.run 'TestKernelTimingMLATCF$|TestKernelTimingMLAPrefill$' > $R/kernels-timing.log 2>&1; echo rc=$? >> $R/kernels-timing.log)
step a
fi
# 2. the whole gpu-check with the candidate decode defaults (tcf2, launches across slots)
if want b; then
TILERT_GPU_MLA_TCF=2 TILERT_GPU_SLOT_MERGE=1 TILERT_GPU_TIMING=0 GPU_CHECK_NOBUILD=1 GPU_TEST_BIN=$D/kernels.test \
  ENGINE_TEST_BIN=$D/engine.test DECODE_TEST_BIN=$D/decode.test OUT=$R/gc timeout 240 scripts/gpu-check.sh > $R/gpu-check.txt 2>&1
echo "gpu-check rc=$?" >> $R/gpu-check.txt
step b
fi
# 3. step tables, default against the candidates in the same run (9 MoE layers, DeepSeek-V3.2 and GLM-5 dims)
if want c; then
for e in "" "TILERT_GPU_MLA_TCF=2" "TILERT_GPU_MLA_TCF=2 TILERT_GPU_SLOT_MERGE=1" "TILERT_GPU_MLA_TCF=8"; do
  n=$(echo "x $e" | tr ' =' '__')
  env $e timeout 45 $D/tilert bench decode --device cuda --dummy-weights deepseek-v3.2 --layers 9 --context 8192,131072 \
    --batches 1,4 --json $R/bench-ds$n.json > $R/bench-ds$n.txt 2>&1
done
TILERT_GPU_MLA_TCF=2 TILERT_GPU_SLOT_MERGE=1 timeout 40 $D/tilert bench decode --device cuda --dummy-weights glm-5 --layers 9 \
  --context 8192,131072 --batches 1,4 --json $R/bench-glm-tcf2.json > $R/bench-glm-tcf2.txt 2>&1
# the per-kernel table of the candidate (where the rest of the step goes)
TILERT_GPU_MLA_TCF=2 TILERT_GPU_SLOT_MERGE=1 timeout 60 $D/tilert bench decode --device cuda --dummy-weights deepseek-v3.2 --layers 9 \
  --context 8192 --batches 1 --profile --json $R/bench-ds-tcf2-profile.json > $R/bench-ds-tcf2-profile.txt 2>&1
step c
fi
# 4. local prefill candidates (issue 10: at least HF's 141 ms at 8192): engine checks, then the timing
if want d; then
P="TILERT_GPU_GEMM=1 TILERT_GPU_ABSORB_TC=1 TILERT_GPU_MLA_PREFILL=3"
(cd engine/gpu && env $P TILERT_ENGINE_REPORT=$R/prefill-engine-report.txt timeout 60 $D/engine.test -test.count=1 -test.v \
  -test.run 'TestGPUCachesMatchCPU$|TestGPUPrefillGemm|TestGPUGreedyMatchesCPU$|TestGPUGoldenExact$|TestGPUMLAPrefillRouted$|TestGPUPenaltiesMatchCPU$' \
  > $R/prefill-engine.log 2>&1; echo rc=$? >> $R/prefill-engine.log)
for e in "TILERT_GPU_GEMM=1" "$P" "$P TILERT_GPU_MLA_PREFILL=2"; do
  n=$(echo "x $e" | tr ' =' '__' | cut -c1-60)
  env $e timeout 30 $D/tilert bench decode --device cuda --dummy-weights deepseek-v3.2 --layers 1 --prompt-len 8192 --tokens 4 \
    --prefill-lens 1024,8192 --profile --json $R/prefill$n.json > $R/prefill$n.txt 2>&1
done
step d
fi
# Multi-GPU (issue 11), only when an nvidia-h200-x2..x8 kind is lent: TestGPUShardSeveralGPUs,
# `tilert bench decode --devices 0,...,N-1`, the decode hand-off into a sharded node, the all-reduce latency.
