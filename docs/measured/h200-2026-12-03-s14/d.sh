# Session 14 call D: the opt-in switches again under today's default (side stream launched plainly), DeepSeek-V3.2
# dims, 9 MoE layers, 8192, 1 slot. Binaries of ad57728 (main with idx131k + grp merged): TILERT_GPU_IDX_LONG=0 and
# TILERT_GPU_GROUP_SPLIT=0 give main's kernels (both measured slower in calls B and C and reverted).
set -x
cd .device/next && for f in *.xz; do [ -e "$f" ] && xz -d -f "$f"; done; chmod +x *; cd ../..
D=$PWD/.device/next
R=/tmp/s14d; rm -rf $R; mkdir -p $R
export TILERT_KERNEL_CACHE=/tmp/tilert-kernels TILERT_GPU_IDX_LONG=0 TILERT_GPU_GROUP_SPLIT=0
bn() { local m=$1 n=$2 t=$3; shift 3; env "$@" timeout $t $D/tilert bench decode --device cuda --dummy-weights $m --layers 9 --context 8192 --batches 1 --json $R/$n.json > $R/$n.txt 2>&1; echo "rc=$?" >> $R/$n.txt; grep -A1 "p50 ms" $R/$n.txt | tail -1 | sed "s/^/$n $* /" >> $R/summary.txt; cp $R/summary.txt $OUT/summary.txt; tar czf $OUT/d.tgz -C $R .; }
bn deepseek-v3.2 base 90
bn deepseek-v3.2 side-q 40 TILERT_GPU_SIDE=q
bn deepseek-v3.2 side-moe 40 TILERT_GPU_SIDE=moe
bn deepseek-v3.2 fuse2 40 TILERT_GPU_FUSE=2
bn deepseek-v3.2 fuse3 40 TILERT_GPU_FUSE=3
bn deepseek-v3.2 group3 40 TILERT_GPU_GROUP=3
bn deepseek-v3.2 pdlmore0 40 TILERT_GPU_PDL_MORE=0
bn deepseek-v3.2 absorb-rw2 40 TILERT_GPU_ABSORB_FAST_RW=2
bn deepseek-v3.2 base2 40
