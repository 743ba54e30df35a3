# Session 15's plan for the next device session (issue 10; NOT RUN): which programmatic launches cost more than they
# save beside the side streams, per kernel family, and the side stream's cap at 131072 where the indexer pair is on
# the critical path. Env only, no new code. Why: session 15 call C found GLM-5's spread o_proj 18 us a step faster
# launched plainly than programmatically (more than the kernel's own gain), while call D's three families
# (gemv_tile_fp8_r8_m1_d16, gemv_group, moe_) were not faster plainly on DeepSeek-V3.2 dims.
# Usage (binaries: the tilert of main, xz'd or not, in .device/next): bash docs/measured/next/sweep15.sh ds|glm|long
# Each part ~4-5 min warm (~24 s a bench run); each family runs once, the base three times (start, middle, end).
set -x
if ls .device/next/*.xz >/dev/null 2>&1; then (cd .device/next && for f in *.xz; do xz -d -f "$f"; done); fi
chmod +x .device/next/* 2>/dev/null
D=$PWD/.device/next
P=$1; R=/tmp/sweep15-$P; rm -rf $R; mkdir -p $R
export TILERT_KERNEL_CACHE=/tmp/tilert-kernels
bn() { local m=$1 c=$2 n=$3; shift 3; env "$@" timeout 40 $D/tilert bench decode --device cuda --dummy-weights $m --layers 9 --context $c --batches 1 > $R/$n.txt 2>&1; echo "rc=$?" >> $R/$n.txt; grep -A1 "p50 ms" $R/$n.txt | tail -1 | sed "s/^/$n $* /" | tee -a $R/summary.txt; cp $R/summary.txt $OUT/summary-$P.txt 2>/dev/null; tar czf $OUT/sweep15-$P.tgz -C $R .; }
fams="gemv_tile_fp8_r8_m1_o4 gemv_tile_fp8_r4_m1_o4 gemv_tile_bf16 add_rmsnorm rmsnorm attn_epilogue idx_q_prep indexer_scores_mma topk_radix mla_combine moe_combine moe_route"
case "$1" in
ds|glm)
  m=deepseek-v3.2; [ "$1" = glm ] && m=glm-5
  bn $m 8192 base1
  i=0; for f in $fams; do bn $m 8192 plain-$f TILERT_GPU_PDL_PLAIN=$f; i=$((i+1)); [ $i = 6 ] && bn $m 8192 base2; done
  bn $m 8192 base3 ;;
long)
  for m in deepseek-v3.2 glm-5; do
    bn $m 131072 $m-base
    bn $m 131072 $m-cap0 TILERT_GPU_SIDE_CAP=0
    bn $m 131072 $m-cap2 TILERT_GPU_SIDE_CAP=2
    bn $m 131072 $m-side-moe TILERT_GPU_SIDE=moe
    bn $m 131072 $m-plain-idx TILERT_GPU_PDL_PLAIN=idx_q_prep,indexer_scores_mma,topk_radix
  done ;;
*) echo "usage: sweep15.sh ds|glm|long" >&2; exit 2 ;;
esac
