# Session 16 call D: each side chain's tile cap alone (TILERT_GPU_SIDE_CAP=q=B,sh=B), decode at 8192 and 131072,
# 1 slot, 9 MoE layers, both models; then the side-stream GPU checks (same tokens with each chain capped alone).
set -x
(cd .device/next && for f in *.xz; do [ -e "$f" ] && xz -d -f "$f"; done); chmod +x .device/next/*
D=$PWD/.device/next; export TILERT_KERNEL_CACHE=/tmp/tilert-kernels
bn() { local m=$1 c=$2 n=$3; shift 3; env X=1 "$@" timeout 45 $D/tilert bench decode --device cuda --dummy-weights $m --layers 9 --context $c --batches 1 > $OUT/$n.txt 2>&1; echo "rc=$?" >> $OUT/$n.txt; grep -A1 "p50 ms" $OUT/$n.txt | tail -1 | sed "s/^/$n $* /" | tee -a $OUT/summary.txt; }
bn deepseek-v3.2 8192 ds-8k-base
bn deepseek-v3.2 8192 ds-8k-cap0 TILERT_GPU_SIDE_CAP=0
bn deepseek-v3.2 8192 ds-8k-q0 TILERT_GPU_SIDE_CAP=q=0,sh=1
bn deepseek-v3.2 8192 ds-8k-sh0 TILERT_GPU_SIDE_CAP=q=1,sh=0
bn glm-5 8192 glm-8k-base
bn glm-5 8192 glm-8k-q0 TILERT_GPU_SIDE_CAP=q=0,sh=1
bn glm-5 8192 glm-8k-sh0 TILERT_GPU_SIDE_CAP=q=1,sh=0
bn deepseek-v3.2 131072 ds-128k-q0 TILERT_GPU_SIDE_CAP=q=0,sh=1
bn deepseek-v3.2 131072 ds-128k-sh0 TILERT_GPU_SIDE_CAP=q=1,sh=0
bn glm-5 131072 glm-128k-q0 TILERT_GPU_SIDE_CAP=q=0,sh=1
bn glm-5 131072 glm-128k-sh0 TILERT_GPU_SIDE_CAP=q=1,sh=0
cd engine/gpu && timeout 150 $D/engine.test -test.run 'TestGPUSideStreamSameTokens|TestGPUSideCapScoped' -test.v -test.count=1 > $OUT/side-tests.txt 2>&1; echo "rc=$?" >> $OUT/side-tests.txt
grep -E "^(--- |ok|FAIL|PASS|rc=)" $OUT/side-tests.txt | tail -20
