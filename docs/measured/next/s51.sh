# Session 51's device plan (issue 10). Usage: bash docs/measured/next/s51.sh b9|sh|h5|mp|wq|rs   (binaries in .device/next)
#  h5 (~4 min, an H200; tilert alone): what s49.sh h4 queued, with the whole table first: b9 below (every README row,
#    traced steps), then A/B/A/B on DeepSeek-V3.2 dims 8192 of the gate/up on _d16 (an H200 takes _o4 since session
#    30's normal-load sweep), TILERT_GPU_WHOLE_CHUNKS=0 (session 49's rule, never run on an H200), and today's defaults
#    against session 47's (L2_EVICT=keys, EXPERT_SHAPE=30, WHOLE_CHUNKS=0), the last on GLM-5 dims 131072 too.
#  On an H100 this session re-takes what the README shows from older mains (the sizes: ~1 min each there):
#  b9 (any card; tilert): the README's 9-MoE-layer rows on today's main (session 47 last took the whole table,
#    four sessions of defaults ago): both models at 8192 and 131072, 1 and 4 slots, the MTP rows and a traced step of
#    each (plan.sh's rows), one expert bank on a card under 100 GB.
#  sh (any card; engine.test, tilert): TestGPUShardLayerTiming (the TP-8 shard of one real MoE layer, graphed
#    and launched one by one, with the fused all-reduce; last timed in session 11 on an H200) with TILERT_GPU_TIMING=1,
#    its table into shard-timing.txt; then GLM-5 dims' MTP rows at 1 and 4 slots.
#  mp (any card; tilert): does q_b's load depth slow the indexer chain beside it? Call A's DeepSeek-V3.2 dims trace
#    has attn_epilogue_qs end 8.2 us after wq_b, GLM-5 dims' 4.5 us: the same kernel, the same work a block. Beside it
#    runs q_b: DeepSeek-V3.2 dims' on _d16 (16 loads in flight a thread, 128 registers: two blocks fill an SM),
#    GLM-5 dims' on _o4. If the bytes in flight set the latency every other load waits (Little's law: ~17 MB in
#    flight at ~3 TB/s is ~5.7 us), q_b on _o4 shortens the epilogue, the scores and the top-k, and costs q_b little
#    (it ends 3.3 us before the top-k). One traced step each way, then A/B/A/B at 8192 and 131072, and wq_b too.
#  wq (any card; tilert): mp's wq_b on _o4 lost 51 us a step: wq_b, on the critical chain, shares the bandwidth with
#    q_b beside it roughly by loads in flight. So more of them for wq_b: its 8192 rows of 1536 on 256 or 512 blocks
#    (G32/R4_d16, G32/R2_d16; today 128 on G32/R8_d16) or dealt over two blocks an SM (G32/R8_d16s), alone and with q_b on _o4; A/B/A/B at 8192, the best at 131072.
#  rs (any card; tilert): residency or queueing? With q_b's 384 `_d16` blocks two to an SM, the indexer chain's blocks
#    may find no SM with room. TILERT_GPU_SIDE_CAP=q=1 keeps q_b to one block an SM (raised one-row steps run it
#    uncapped since session 29): one traced step each way and one with the main chain not raised
#    (TILERT_GPU_MAIN_PRIO=0: if pending blocks decide, the epilogue ends later), then A/B/A/B at 8192 and 131072.
NAME=s51
. docs/measured/next/plan.sh "$1"
case "$PART" in
b9|h5)
  rows
  grep -h -E "timeline|idle |layers \(each" $R/tl-ds.txt $R/tl-glm.txt | head -16 >> $R/summary.txt; save
  if [ "$PART" = h5 ]; then
    MTP=1 bn glm-5 8192 1,4 glm-mtp
    abab deepseek-v3.2 8192 1 x8 TILERT_GPU_EXPERT_SHAPE=d16
    abab deepseek-v3.2 8192 1 wc8 TILERT_GPU_WHOLE_CHUNKS=0
    O="TILERT_GPU_L2_EVICT=keys TILERT_GPU_EXPERT_SHAPE=30 TILERT_GPU_WHOLE_CHUNKS=0"
    abab deepseek-v3.2 8192 1 o8 $O; abab glm-5 131072 1 og131 $O
  fi ;;
sh)
  (cd engine/gpu && TILERT_GPU_TIMING=1 TILERT_SHARD_REPORT=$R/shard-timing.txt timeout 300 $D/engine.test -test.v -test.count=1 \
    -test.timeout=290s -test.run '^TestGPUShardLayerTiming$' > $R/shard.log 2>&1; echo "rc=$?" >> $R/shard.log)
  cnt shard; grep -E "MoE layer|with its communication|projection" $R/shard-timing.txt >> $R/summary.txt; save
  MTP=1 bn glm-5 8192 1,4 glm-mtp ;;
mp)
  Q=TILERT_GPU_TILE_PLANS=24576x1536=G32/R8_o4/B0
  TL=1 bn deepseek-v3.2 8192 1 tl-A; TL=1 bn deepseek-v3.2 8192 1 tl-B $Q
  for f in tl-A tl-B; do awk '/as it ran/{f=1} f' $R/$f.txt | head -14 | sed "s|^|$f |" >> $R/summary.txt; done; save
  abab deepseek-v3.2 8192 1 q8 $Q
  abab deepseek-v3.2 131072 1 q131 $Q
  abab deepseek-v3.2 8192 1 r8 TILERT_GPU_TILE_PLANS=24576x1536=G32/R4_o4/B0
  abab deepseek-v3.2 8192 1 w8 $Q,8192x1536=G32/R8_o4/B0
  xz -T4 $R/tl-*.json 2>/dev/null; save ;;
wq)
  Q=24576x1536=G32/R8_o4/B0 E=TILERT_GPU_TILE_PLANS
  abab deepseek-v3.2 8192 1 w4 $E=8192x1536=G32/R4_d16/B0
  abab deepseek-v3.2 8192 1 w2 $E=8192x1536=G32/R2_d16/B0
  abab deepseek-v3.2 8192 1 w4q $E=8192x1536=G32/R4_d16/B0,$Q
  abab deepseek-v3.2 8192 1 w8s $E=8192x1536=G32/R8_d16s/B0
  abab deepseek-v3.2 131072 1 w4l $E=8192x1536=G32/R4_d16/B0
  TL=1 bn deepseek-v3.2 8192 1 tl-w4 $E=8192x1536=G32/R4_d16/B0
  awk '/as it ran/{f=1} f' $R/tl-w4.txt | head -14 >> $R/summary.txt; xz -T4 $R/tl-*.json 2>/dev/null; save ;;
rs)
  C=TILERT_GPU_SIDE_CAP=q=1
  TL=1 bn deepseek-v3.2 8192 1 tl-A; TL=1 bn deepseek-v3.2 8192 1 tl-B $C; TL=1 bn deepseek-v3.2 8192 1 tl-C TILERT_GPU_MAIN_PRIO=0
  for f in tl-A tl-B tl-C; do awk '/as it ran/{f=1} f' $R/$f.txt | head -12 | sed "s|^|$f |" >> $R/summary.txt; done; save
  abab deepseek-v3.2 8192 1 c8 $C
  abab deepseek-v3.2 131072 1 c131 $C
  xz -T4 $R/tl-*.json 2>/dev/null; save ;;
*) echo "usage: s51.sh b9|sh|h5|mp|wq|rs" >&2; exit 2 ;;
esac
