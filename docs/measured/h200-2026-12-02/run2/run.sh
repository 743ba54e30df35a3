# Session 6's second device window: the helpers' candidates (prefill GEMMs in one bf16 part, the
# one-part sparse MLA prefill, decode norms fused into their neighbours), each behind its switch.
# Build from main (repo root):
#   mkdir -p .device/next2
#   CGO_ENABLED=0 go test -c -ldflags="-s -w" -trimpath -o .device/next2/kernels.test ./cuda/kernels
#   CGO_ENABLED=0 go test -c -ldflags="-s -w" -trimpath -o .device/next2/engine.test ./engine/gpu
#   CGO_ENABLED=0 go test -c -ldflags="-s -w" -trimpath -o .device/next2/decode.test ./roles/decode
#   CGO_ENABLED=0 go build -ldflags="-s -w" -trimpath -o .device/next2/tilert . && gzip -9 .device/next2/*
# then carry [".device/next2"] and run `STEPS=a bash docs/measured/next2/run.sh` (the prefill candidates),
# then at once `STEPS=b CAND="..." bash docs/measured/next2/run.sh` (the norm fusion, then the whole
# gpu-check with $CAND, the switches chosen from call a's results); two back-to-back calls, each step
# tars $R into $OUT.
set -x
cd .device/next2 && gunzip -f *.gz; chmod +x *; cd ../..
D=$PWD/.device/next2
R=/tmp/next2; mkdir -p $R/gc
export TILERT_KERNEL_CACHE=/tmp/tilert-kernels
step() { tar czf $OUT/$1.tgz -C $R . ; }
want() { case ${STEPS:-ab} in *$1*) return 0;; esac; return 1; }
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv > $R/smi.txt 2>&1
if want a; then
  for f in pgemm pmla; do
    [ -f docs/measured/next2/$f.sh ] || continue
    mkdir -p $R/$f
    (R=$R/$f; . docs/measured/next2/$f.sh) > $R/$f/console.txt 2>&1
    step a
  done
  # both one-part prefill kernels together (the figure against HF's 141 ms at 8192), and their engine checks
  P1="TILERT_GPU_GEMM=1 TILERT_GPU_ABSORB_TC=1 TILERT_GPU_MLA_PREFILL=4 TILERT_GPU_GEMM_SPLITS=1"
  env $P1 timeout 30 $D/tilert bench decode --device cuda --dummy-weights deepseek-v3.2 --layers 1 --prompt-len 8192 --tokens 4 \
    --prefill-lens 1024,8192 --profile --json $R/prefill-onepart.json > $R/prefill-onepart.txt 2>&1
  (cd engine/gpu && env $P1 TILERT_ENGINE_REPORT=$R/onepart-engine-report.txt timeout 60 $D/engine.test -test.count=1 -test.v \
    -test.run 'TestGPUMLAPrefillH1$|TestGPUPrefillGemmP1Greedy$|TestGPUPrefillGemmP1Caches$|TestGPUPrefillGemmP1Logits$' \
    > $R/onepart-engine.log 2>&1; echo rc=$? >> $R/onepart-engine.log)
  step a
fi
if want b; then
  # the decode norm fusion (bit for bit the default; its own checks and bench off / on)
  mkdir -p $R/dnorm
  (R=$R/dnorm; . docs/measured/next2/dnorm.sh) > $R/dnorm/console.txt 2>&1
  step b
  # the whole gpu-check with the candidates that are to become defaults ($CAND: env assignments)
  echo "$CAND" > $R/cand.env
  env $CAND TILERT_GPU_TIMING=0 GPU_CHECK_NOBUILD=1 GPU_TEST_BIN=$D/kernels.test ENGINE_TEST_BIN=$D/engine.test \
    DECODE_TEST_BIN=$D/decode.test OUT=$R/gc timeout 260 scripts/gpu-check.sh > $R/gpu-check.txt 2>&1
  echo "gpu-check rc=$?" >> $R/gpu-check.txt
  step b
  env $CAND timeout 45 $D/tilert bench decode --device cuda --dummy-weights glm-5 --layers 9 --context 8192,131072 \
    --batches 1,4 --json $R/bench-glm-cand.json > $R/bench-glm-cand.txt 2>&1
  step b
fi
