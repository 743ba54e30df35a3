# Session 12 call B: which programmatic launches pay. Call A: all of TILERT_GPU_PDL_MORE's kernels
# programmatic cost 150 us a step (2.771 -> 2.928 ms). Here each family alone, on (MORE) or off (PLAIN),
# DeepSeek-V3.2 dims, 9 MoE layers, 8192, 1 slot, p50. Base three times for the noise.
# Prediction: the MORE cost sits in one family whose early-resident blocks hold SM room that the side
# stream's capped kernels wait for (mla_decode_tcf2 beside absorb_q, or absorb_q beside the indexer);
# some default programmatic launches next to a fork (router/route, experts gate/up) may cost the same way.
set -x
cd .device/next && for f in *.xz; do xz -d -f "$f"; done; chmod +x *; cd ../..
D=$PWD/.device/next
R=/tmp/s12b; rm -rf $R; mkdir -p $R
export TILERT_KERNEL_CACHE=/tmp/tilert-kernels
bn() { local n=$1 t=$2; shift 2; env "$@" timeout $t $D/tilert bench decode --device cuda --dummy-weights deepseek-v3.2 --layers 9 --context 8192 --batches 1 --json $R/$n.json > $R/$n.txt 2>&1; echo "rc=$?" >> $R/$n.txt; grep -A1 "p50 ms" $R/$n.txt | tail -1 | sed "s/^/$n $* /" >> $R/summary.txt; cp $R/summary.txt $OUT/summary.txt; }
bn base 120
bn more-mla 45 TILERT_GPU_PDL_MORE=mla_decode_tcf
bn more-absq 45 TILERT_GPU_PDL_MORE=absorb_q
bn more-absv 45 TILERT_GPU_PDL_MORE=absorb_v
bn more-few 45 TILERT_GPU_PDL_MORE=topk_fast,mla_decode_few,mla_combine_few,indexer_scores_topk
bn more-mid 45 TILERT_GPU_PDL_MORE=gemv_mid
bn base2 45
bn plain-tile 45 TILERT_GPU_PDL_PLAIN=gemv_tile_fp8
bn plain-route 45 TILERT_GPU_PDL_PLAIN=moe_route,gemv_bf16_wide
bn plain-norm 45 TILERT_GPU_PDL_PLAIN=add_rmsnorm,rmsnorm
bn plain-group 45 TILERT_GPU_PDL_PLAIN=gemv_group
bn plain-idx 45 TILERT_GPU_PDL_PLAIN=indexer_scores,topk_radix,idx_q_prep
bn plain-comb 45 TILERT_GPU_PDL_PLAIN=moe_combine,attn_epilogue
bn base3 45
tar czf $OUT/b.tgz -C $R .
