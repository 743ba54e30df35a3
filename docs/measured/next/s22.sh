# Session 21's plan for the next device session (issue 10; NOT RUN). Binaries of main (tilert; kernels.test for
# `check`) in .device/next, xz'd or not (the build line in docs/measured/next/README.md). Ask `status` first.
# Usage: bash docs/measured/next/s22.sh front|ncu|check
#  front (~5 min cold): the attention front, the layer's largest latency segment (28 us over its bytes at DeepSeek-V3.2
#        dims, 8192, 1 slot: session 21 call D's timeline), against the two switches that shape it, each row timed and
#        then traced in its own process (--timeline; a traced row slows the rows after it a little): q_b's side cap
#        (1 block an SM by default at one row: q_b streams 37.7 MB at 1.3 TB/s beside the indexer chain) and the q
#        chain's fork point (topk-all: after the scores instead of at q_a, so the top-k runs without q_b beside it;
#        session 17 measured these as step times only, engine/gpu/side.go's comment; the timeline shows why).
#  ncu (~3 min): the layer's small critical-path kernels alone under ncu (DeepSeek-V3.2 dims, 2 layers, 8192, 1 slot):
#        their own duration against the time the step charges them, and where their warps stall.
#  check (~4 min): the kernel checks, if kernels changed.
set -x
if ls .device/next/*.xz >/dev/null 2>&1; then (cd .device/next && for f in *.xz; do xz -d -f "$f"; done); fi
chmod +x .device/next/* 2>/dev/null
D=$PWD/.device/next
P=$1; R=/tmp/s22-$P; rm -rf $R; mkdir -p $R
export TILERT_KERNEL_CACHE=/tmp/tilert-kernels
save() { tar czf $OUT/s22-$P.tgz -C $R .; cp $R/summary.txt $OUT/summary-$P.txt 2>/dev/null; }
bn() { local m=$1 c=$2 b=$3 n=$4; shift 4; env X=1 "$@" timeout 120 $D/tilert bench decode --device cuda --dummy-weights $m --layers 9 --context $c --batches $b ${TL:+--timeline $R/$n.json} > $R/$n.txt 2>&1; echo "rc=$?" >> $R/$n.txt; grep -E "^ +[0-9]+ +[0-9]+ +[0-9.]+ " $R/$n.txt | sed "s|^|$n $* |" | tee -a $R/summary.txt; save; }
timeout 120 $D/tilert bench decode --device cuda --dummy-weights glm-5 --layers 1 --context 1024 --batches 1 > $R/warm.txt 2>&1
case "$P" in
front)
  for m in deepseek-v3.2 glm-5; do
    bn $m 8192 1 $m-default
    bn $m 8192 1 $m-cap2 TILERT_GPU_SIDE_CAP=q=2
    bn $m 8192 1 $m-cap0 TILERT_GPU_SIDE_CAP=q=0
    bn $m 8192 1 $m-late TILERT_GPU_SIDE_Q_AT=topk-all
    bn $m 8192 1 $m-default2
  done
  TL=1 bn deepseek-v3.2 8192 1 tl-ds-default
  TL=1 bn deepseek-v3.2 8192 1 tl-ds-cap2 TILERT_GPU_SIDE_CAP=q=2
  xz -T4 $R/*.json 2>/dev/null; save ;;
ncu)
  NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
  K='regex:topk_radix_one|moe_route_rank|gemv_bf16_wide_r1|add_rmsnorm_reg|attn_epilogue|indexer_scores_mma_pf|mla_combine_wide|absorb_v_fast|absorb_q_fast|rmsnorm_reg|moe_combine_norm|mla_decode_wg2b'
  timeout 300 $NCU --set full -k "$K" -c 16 -o $R/small $D/tilert bench decode --device cuda --dummy-weights deepseek-v3.2 --layers 2 --context 8192 --batches 1 > $R/ncu-run.txt 2>&1; echo rc=$? >> $R/ncu-run.txt
  $NCU -i $R/small.ncu-rep --page details --csv > $R/ncu-details.csv 2>&1
  $NCU -i $R/small.ncu-rep --page raw --csv --metrics gpu__time_duration.sum,launch__grid_size,launch__block_size,dram__bytes.sum,smsp__cycles_active.avg > $R/ncu-raw.csv 2>&1
  $NCU -i $R/small.ncu-rep --page source --csv --print-source sass -k regex:topk_radix_one > $R/ncu-source-topk.csv 2>&1
  grep -E '"Duration"' $R/ncu-details.csv | cut -d, -f5,12- | tee -a $R/summary.txt
  save ;;
check)
  (cd cuda/kernels && timeout 420 $D/kernels.test -test.v -test.count=1 -test.timeout=9m > $R/kernels.log 2>&1; echo "rc=$?" >> $R/kernels.log)
  echo "kernels: $(grep -c '^--- PASS' $R/kernels.log) PASS, $(grep -c '^--- FAIL' $R/kernels.log) FAIL, $(grep -c '^--- SKIP' $R/kernels.log) SKIP; $(tail -1 $R/kernels.log)" | tee -a $R/summary.txt
  save ;;
*) echo "usage: s22.sh front|ncu|check" >&2; exit 2 ;;
esac
