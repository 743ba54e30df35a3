# The device plan for the next session with H200 time (NOT RUN). Two calls back to back (the machine stays
# warm 30 s): `STEPS=a bash docs/measured/next/run.sh` (~300 s: helper pwg's wgmma MLA prefill, never run on a
# GPU, then the prefill benches), then `STEPS=b bash ...` (~400 s: the whole gpu-check with the one-part
# switches on). It decides whether the one-part prefill (TILERT_GPU_GEMM_SPLITS=1: gemm_p1 + absorb_p1, and
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
case "${STEPS:-ab}" in *a*)
# 0. helper pwg's fragment (<= 120 s): mla_prefill_wg (TILERT_GPU_MLA_PREFILL=5, sm_90a wgmma) checks,
#    the wgmma probe, timing, the 8192-token prefill with it, its engine checks
source docs/measured/next3/pwg.sh
step pwg
# 1. the prefill benches
i=0
for e in "" "$CAND"; do
  i=$((i+1)); echo "$e" > $R/prefill-$i.env
  env $e timeout 90 $D/tilert bench decode --device cuda --dummy-weights deepseek-v3.2 --layers 1 --prompt-len 8192 --tokens 4 \
    --prefill-lens 1024,8192 --profile --json $R/prefill-$i.json > $R/prefill-$i.txt 2>&1
done
step a
;; esac
case "${STEPS:-ab}" in *b*)
# 2. the whole gpu-check with the candidates as defaults
env $CAND TILERT_GPU_TIMING=0 GPU_CHECK_NOBUILD=1 GPU_TEST_BIN=$D/kernels.test ENGINE_TEST_BIN=$D/engine.test \
  DECODE_TEST_BIN=$D/decode.test OUT=$R/gc timeout 400 scripts/gpu-check.sh > $R/gpu-check.txt 2>&1
echo "gpu-check rc=$?" >> $R/gpu-check.txt
step b
;; esac
