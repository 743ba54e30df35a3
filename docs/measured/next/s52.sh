# Session 52's device plan (issue 10). Usage: bash docs/measured/next/s52.sh bc|bl|rt|h5   (binaries in .device/next)
#  bc (any card; kernels.test, tilert): block clocks (TILERT_GPU_BLOCK_CLOCKS=1, built this session: each block's
#    entry, release from its PDL wait and exit, read by a traced step). TestGPUBlockClocks, then a traced DeepSeek-V3.2
#    dims step at 8192 without and with clocks (the clocks' own cost is the difference of the two steps) and a GLM-5
#    dims one with clocks; the median layer's block table of each into the summary.
#  bl (any card; tilert): bc's traced steps again (each one-to-eight-block launch now listed block by block), and both
#    models at 131072 with clocks (the top-k's and the scores' launches differ there).
#  rt (any card; kernels.test, tilert): moe_route_sort (TILERT_GPU_ROUTE_SORT=1, built this session without a device):
#    TestKernelSmallFast (its outputs against moe_route's, bit for bit, ties and dropped groups included), its graph
#    time beside moe_route_rank's (TestKernelSmallTiming), then A/B/A/B on both models at 8192 and a traced step of
#    each with block clocks and the switch on.
#  h5 (an H200; tilert alone): s51.sh h5 first (every README row with traced steps, then session 49's A/B/A/Bs;
#    H5S seconds, default 330), then bl unless H5ONLY is set.
NAME=s52
. docs/measured/next/plan.sh "$1"
blocks() { awk '/as it ran/{f=1} f' $R/$1.txt | grep -v "^rc=" | head -120 | sed "s|^|$1 |" >> $R/summary.txt; }
bc() {
  tst kernels cuda/kernels 150 '^TestGPUBlockClocks$'; cnt kernels; grep "first launch" $R/kernels.log >> $R/summary.txt
  TL=1 bn deepseek-v3.2 8192 1 tl-ds
  TL=1 bn deepseek-v3.2 8192 1 tl-dsc TILERT_GPU_BLOCK_CLOCKS=1
  TL=1 bn glm-5 8192 1 tl-glmc TILERT_GPU_BLOCK_CLOCKS=1
  grep -h "block clocks" $R/tl-dsc.txt $R/tl-glmc.txt | cut -c1-400 >> $R/summary.txt
  for f in tl-ds tl-dsc tl-glmc; do blocks $f; done
  xz -T4 $R/tl-*.json 2>/dev/null; save
}
case "$PART" in
bc) bc ;;
rt)
  tst kernels cuda/kernels 200 '^TestKernelSmallFast$'; cnt kernels
  export TILERT_GPU_TIMING=1; tst kernels cuda/kernels 200 '^TestKernelSmallTiming$'; unset TILERT_GPU_TIMING
  cnt kernels; grep -E "moe_route" $R/kernels.log | head -20 >> $R/summary.txt; save
  abab deepseek-v3.2 8192 1 rs8 TILERT_GPU_ROUTE_SORT=1
  abab glm-5 8192 1 rg8 TILERT_GPU_ROUTE_SORT=1
  TL=1 bn deepseek-v3.2 8192 1 tl-dsr TILERT_GPU_BLOCK_CLOCKS=1 TILERT_GPU_ROUTE_SORT=1
  TL=1 bn glm-5 8192 1 tl-glmr TILERT_GPU_BLOCK_CLOCKS=1 TILERT_GPU_ROUTE_SORT=1
  for f in tl-dsr tl-glmr; do grep -E "moe_route|block 0 \(SM" $R/$f.txt | head -12 | sed "s|^|$f |" >> $R/summary.txt; done
  xz -T4 $R/tl-*.json 2>/dev/null; save ;;
bl)
  TL=1 bn deepseek-v3.2 8192 1 tl-ds
  TL=1 bn deepseek-v3.2 8192 1 tl-dsc TILERT_GPU_BLOCK_CLOCKS=1
  TL=1 bn glm-5 8192 1 tl-glmc TILERT_GPU_BLOCK_CLOCKS=1
  TL=1 bn deepseek-v3.2 131072 1 tl-dsl TILERT_GPU_BLOCK_CLOCKS=1
  TL=1 bn glm-5 131072 1 tl-glml TILERT_GPU_BLOCK_CLOCKS=1
  grep -h "block clocks" $R/tl-*.txt | cut -c1-400 >> $R/summary.txt
  for f in tl-dsc tl-glmc tl-dsl tl-glml; do blocks $f; done
  xz -T4 $R/tl-*.json 2>/dev/null; save ;;
h5)
  timeout ${H5S:-330} bash docs/measured/next/s51.sh h5 > $R/s51-h5.log 2>&1; echo "s51 h5 rc=$?" >> $R/summary.txt
  cp $OUT/summary-h5.txt $R/s51-summary-h5.txt 2>/dev/null; save
  [ -n "$H5ONLY" ] && exit 0
  bash docs/measured/next/s52.sh bl > $R/bl.log 2>&1; cp $OUT/summary-bl.txt $R/ 2>/dev/null; save ;;
*) echo "usage: s52.sh bc|bl|rt|h5" >&2; exit 2 ;;
esac
