# Session 20, call C (issue 10): the steps on session 20's final defaults (mla_decode_wg2b for one-tile blocks, the
# MoE combine + closing norm in one launch; the fused router removed), both models, 8192 and 131072, 1 and 4 slots,
# the MTP step, and the 1-slot in-graph profile at 8192 (where the time goes now).
# Binaries of main (tilert) in .device/next, xz'd or not. Usage: bash s20c.sh (~5 min cold)
set -x
if ls .device/next/*.xz >/dev/null 2>&1; then (cd .device/next && for f in *.xz; do xz -d -f "$f"; done); fi
chmod +x .device/next/* 2>/dev/null
D=$PWD/.device/next; R=/tmp/s20c; rm -rf $R; mkdir -p $R
export TILERT_KERNEL_CACHE=/tmp/tilert-kernels
save() { tar czf $OUT/s20c.tgz -C $R .; cp $R/summary.txt $OUT/summary.txt 2>/dev/null; }
bn() { local m=$1 c=$2 b=$3 n=$4; shift 4; env X=1 "$@" timeout 120 $D/tilert bench decode --device cuda --dummy-weights $m --layers 9 --context $c --batches $b ${MTP:+--mtp} ${PROF:+--profile} ${JS:+--json $R/$n.json} > $R/$n.txt 2>&1; echo "rc=$?" >> $R/$n.txt; grep -E "^ +[0-9]+ +[0-9]+ +[0-9.]+ " $R/$n.txt | sed "s|^|$n $* |" | tee -a $R/summary.txt; save; }
timeout 120 $D/tilert bench decode --device cuda --dummy-weights glm-5 --layers 1 --context 1024 --batches 1 > $R/warm.txt 2>&1
bn deepseek-v3.2 8192,131072 1,4 ds
bn glm-5 8192,131072 1,4 glm
MTP=1 bn deepseek-v3.2 8192 1 ds-mtp
JS=1 bn deepseek-v3.2 8192,131072 1 ds-json
JS=1 bn glm-5 8192,131072 1 glm-json
PROF=1 bn deepseek-v3.2 8192 1 ds-prof
PROF=1 bn glm-5 8192 1 glm-prof
