# Session 11 call F: the opt-in switches measured slower or even on one stream, again under this session's defaults
# (programmatic launches, side streams, side GEMVs capped): does any now pay? DeepSeek-V3.2 dims, 9 MoE layers, 8192,
# 1 slot, p50; then GLM-5 dims with each fork alone.
set -x
cd .device/next && for f in *.xz; do xz -d -f "$f"; done; chmod +x *; cd ../..
D=$PWD/.device/next
R=/tmp/s11f; rm -rf $R; mkdir -p $R
export TILERT_KERNEL_CACHE=/tmp/tilert-kernels
bn() { local m=$1 n=$2; shift 2; env "$@" timeout 45 $D/tilert bench decode --device cuda --dummy-weights $m --layers 9 --context 8192 --batches 1 --json $R/$n.json > $R/$n.txt 2>&1; echo "rc=$?" >> $R/$n.txt; grep -A1 "p50 ms" $R/$n.txt | tail -1 | sed "s/^/$n $* /" >> $R/summary.txt; cp $R/summary.txt $OUT/summary.txt; }
bn deepseek-v3.2 base
bn deepseek-v3.2 normfuse1 TILERT_GPU_NORM_FUSE=1
bn deepseek-v3.2 fuse3 TILERT_GPU_FUSE=3
bn deepseek-v3.2 topk2 TILERT_GPU_TOPK_FAST=2
bn deepseek-v3.2 cap2 TILERT_GPU_SIDE_CAP=2
bn deepseek-v3.2 group3 TILERT_GPU_GROUP=3
bn deepseek-v3.2 base2
bn glm-5 glm-base
bn glm-5 glm-q TILERT_GPU_SIDE=q
bn glm-5 glm-moe TILERT_GPU_SIDE=moe
cat $R/summary.txt
tar czf $OUT/f.tgz -C $R .
