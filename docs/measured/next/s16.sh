# Session 16's plan for the next device session (issue 10; NOT RUN). Binaries of main (tilert, engine.test,
# kernels.test, decode.test, cuda.test; the build line in docs/measured/next/README.md), xz'd or not, in .device/next.
# Usage: bash docs/measured/next/s16.sh check|bench|long|slots
#  check (~330 s warm, ~420 cold): the engine, decode-node and cuda parts of gpu-check on the per-chain side cap
#        (GLM-5's q chain uncapped since e966366), TestGPUSideCapDefault among them.
#  bench (~5 min warm): the reading behind the cap rule, and GLM-5's dense down spread, env only
#        (TILERT_GPU_TILE_PLANS pins a shape's one-row plan; same G = same bits):
#        - GLM-5 q_b (16384 x 2048) on _d16 instead of _o4, capped / uncapped. If the reading holds (an _o4 launch
#          is starved by the cap, a _d16 one is not), capped _d16 lands near or under the default's ~2.774 ms.
#        - GLM-5's dense down (6144 x 12288, the 3 dense layers) spread as o_proj is (busiest SM 64 -> 48 rows):
#          predicted a few us a layer, ~-10 us a step at most.
#        - DeepSeek-V3.2 q_b (24576 x 1536) on _o4 capped (the converse: predicted slower than its default).
#  long (~4 min): the q chain forked beside the indexer's top-k alone (TILERT_GPU_SIDE_Q_AT=topk: after the scores
#        launch, rows over 32768 keys) at 131072, each chain cap, both models; =topk-all at 8192. Predicted: the
#        scores run near their alone time (~13-17 us, not ~22) with the SMs to themselves, the q chain beside the
#        top-k's few blocks; 131072 ~-50..-90 us a step if q_b + absorb (~12-20 us) still fit beside the top-k. At
#        8192 the top-k is too short to hide q_b: expected slower there (why topk leaves rows <= 32768 alone).
#  slots (~2 min): the 4-slot rows under today's defaults (the README's are session 14's; several rows keep the q
#        chain capped) and GLM-5's 4 slots with it uncapped (whether the one-row rule should reach them).
set -x
if ls .device/next/*.xz >/dev/null 2>&1; then (cd .device/next && for f in *.xz; do xz -d -f "$f"; done); fi
chmod +x .device/next/* 2>/dev/null
D=$PWD/.device/next
P=$1; R=/tmp/s16-$P; rm -rf $R; mkdir -p $R/gc
export TILERT_KERNEL_CACHE=/tmp/tilert-kernels
save() { tar czf $OUT/s16-$P.tgz -C $R .; cp $R/summary.txt $OUT/summary-$P.txt 2>/dev/null; }
# The first bench of a fresh machine compiles the kernels: a warm-up run without a limit's worry.
warm() { timeout 120 $D/tilert bench decode --device cuda --dummy-weights glm-5 --layers 1 --context 1024 --batches 1 > $R/warm.txt 2>&1; }
bn() { local m=$1 c=$2 b=$3 n=$4; shift 4; env X=1 "$@" timeout 60 $D/tilert bench decode --device cuda --dummy-weights $m --layers 9 --context $c --batches $b > $R/$n.txt 2>&1; echo "rc=$?" >> $R/$n.txt; grep -A1 "p50 ms" $R/$n.txt | tail -1 | sed "s/^/$n $* /" | tee -a $R/summary.txt; save; }
case "$P" in
check)
  TILERT_GPU_TIMING=0 GPU_CHECK_NOBUILD=1 GPU_CHECK_RUN='^$' GPU_TEST_BIN=$D/kernels.test ENGINE_TEST_BIN=$D/engine.test \
    DECODE_TEST_BIN=$D/decode.test CUDA_TEST_BIN=$D/cuda.test OUT=$R/gc timeout 420 scripts/gpu-check.sh > $R/gpu-check.txt 2>&1
  echo "gpu-check rc=$?" >> $R/gpu-check.txt
  grep -h "TestGPUSideCap" -r $R/gc | head; tail -12 $R/gpu-check.txt; save ;;
bench)
  warm
  bn glm-5 8192 1 glm-base
  bn glm-5 8192 1 glm-qb-d16-capped TILERT_GPU_TILE_PLANS=16384x2048=G64/R8_d16/B0 TILERT_GPU_SIDE_CAP=q=1,sh=1
  bn glm-5 8192 1 glm-qb-d16-open TILERT_GPU_TILE_PLANS=16384x2048=G64/R8_d16/B0 TILERT_GPU_SIDE_CAP=q=0,sh=1
  bn glm-5 8192 1 glm-qb-o4-capped TILERT_GPU_SIDE_CAP=q=1,sh=1
  bn glm-5 8192 1 glm-down-spread TILERT_GPU_TILE_PLANS=6144x12288=G64/R8_d16s/B0
  bn glm-5 8192 1 glm-base2
  bn deepseek-v3.2 8192 1 ds-base
  bn deepseek-v3.2 8192 1 ds-qb-o4-capped TILERT_GPU_TILE_PLANS=24576x1536=G64/R8_o4/B0
  bn deepseek-v3.2 8192 1 ds-qb-o4-open TILERT_GPU_TILE_PLANS=24576x1536=G64/R8_o4/B0 TILERT_GPU_SIDE_CAP=q=0,sh=1
  bn deepseek-v3.2 8192 1 ds-q2 TILERT_GPU_SIDE_CAP=q=2,sh=1
  bn deepseek-v3.2 8192 1 ds-base2 ;;
long)
  warm
  bn deepseek-v3.2 131072 1 ds-long-base
  bn deepseek-v3.2 131072 1 ds-long-qtopk TILERT_GPU_SIDE_Q_AT=topk
  bn deepseek-v3.2 131072 1 ds-long-qtopk-open TILERT_GPU_SIDE_Q_AT=topk TILERT_GPU_SIDE_CAP=q=0,sh=1
  bn glm-5 131072 1 glm-long-base
  bn glm-5 131072 1 glm-long-qtopk TILERT_GPU_SIDE_Q_AT=topk
  bn glm-5 131072 1 glm-long-qtopk-capped TILERT_GPU_SIDE_Q_AT=topk TILERT_GPU_SIDE_CAP=q=1,sh=1
  bn deepseek-v3.2 8192 1 ds-8k-qtopk-all TILERT_GPU_SIDE_Q_AT=topk-all
  bn glm-5 8192 1 glm-8k-qtopk-all TILERT_GPU_SIDE_Q_AT=topk-all
  bn deepseek-v3.2 131072 1 ds-long-base2 ;;
slots)
  warm
  bn deepseek-v3.2 8192 4 ds-4
  bn glm-5 8192 4 glm-4
  bn glm-5 8192 4 glm-4-qopen TILERT_GPU_SIDE_CAP=q=0,sh=1 ;;
*) echo "usage: s16.sh check|bench|long|slots" >&2; exit 2 ;;
esac
