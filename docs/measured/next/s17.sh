# Session 17's follow-up to s16.sh long (binaries of main 7f95af2 in .device/next): the late q fork
# (TILERT_GPU_SIDE_Q_AT) with the q chain open, repeated, beside the defaults; the reading behind the cap rule.
set -x
if ls .device/next/*.xz >/dev/null 2>&1; then (cd .device/next && for f in *.xz; do xz -d -f "$f"; done); fi
chmod +x .device/next/* 2>/dev/null
D=$PWD/.device/next
P=${1:-a}; R=/tmp/s17-$P; rm -rf $R; mkdir -p $R
export TILERT_KERNEL_CACHE=/tmp/tilert-kernels
save() { tar czf $OUT/s17-$P.tgz -C $R .; cp $R/summary.txt $OUT/summary-$P.txt 2>/dev/null; }
warm() { timeout 120 $D/tilert bench decode --device cuda --dummy-weights glm-5 --layers 1 --context 1024 --batches 1 > $R/warm.txt 2>&1; }
bn() { local m=$1 c=$2 b=$3 n=$4; shift 4; env X=1 "$@" timeout 60 $D/tilert bench decode --device cuda --dummy-weights $m --layers 9 --context $c --batches $b > $R/$n.txt 2>&1; echo "rc=$?" >> $R/$n.txt; grep -A1 "p50 ms" $R/$n.txt | tail -1 | sed "s/^/$n $* /" | tee -a $R/summary.txt; save; }
warm
bn glm-5 8192 1 glm-base
bn glm-5 8192 1 glm-topkall TILERT_GPU_SIDE_Q_AT=topk-all
bn deepseek-v3.2 131072 1 ds-long-base
bn deepseek-v3.2 131072 1 ds-long-qtopk-open TILERT_GPU_SIDE_Q_AT=topk TILERT_GPU_SIDE_CAP=q=0,sh=1
bn deepseek-v3.2 8192 1 ds-base
bn deepseek-v3.2 8192 1 ds-topkall-open TILERT_GPU_SIDE_Q_AT=topk-all TILERT_GPU_SIDE_CAP=q=0,sh=1
bn glm-5 8192 1 glm-qb-d16-capped TILERT_GPU_TILE_PLANS=16384x2048=G64/R8_d16/B0 TILERT_GPU_SIDE_CAP=q=1,sh=1
bn glm-5 8192 1 glm-down-spread TILERT_GPU_TILE_PLANS=6144x12288=G64/R8_d16s/B0
bn glm-5 131072 1 glm-long-qtopk TILERT_GPU_SIDE_Q_AT=topk
bn glm-5 131072 1 glm-long-base
bn glm-5 8192 1 glm-topkall2 TILERT_GPU_SIDE_Q_AT=topk-all
bn glm-5 8192 1 glm-base2
bn deepseek-v3.2 131072 1 ds-long-qtopk-open2 TILERT_GPU_SIDE_Q_AT=topk TILERT_GPU_SIDE_CAP=q=0,sh=1
