# Session 51's device plan (issue 10). Usage: bash docs/measured/next/s51.sh b9|sh   (binaries in .device/next)
#  On an H200 the queue is still s49.sh h4 (tilert alone). On an H100 this session re-takes what the README shows
#  from older mains:
#  b9 (~8 min, any card; tilert): the README's 9-MoE-layer rows on today's main (session 47 last took the whole table,
#    four sessions of defaults ago): both models at 8192 and 131072, 1 and 4 slots, the MTP rows and a traced step of
#    each (plan.sh's rows), one expert bank on a card under 100 GB.
#  sh (~3 min, any card; engine.test, tilert): TestGPUShardLayerTiming (the TP-8 shard of one real MoE layer, graphed
#    and launched one by one, with the fused all-reduce; last timed in session 11 on an H200) with TILERT_GPU_TIMING=1,
#    its table into shard-timing.txt; then GLM-5 dims' MTP rows at 1 and 4 slots.
NAME=s51
. docs/measured/next/plan.sh "$1"
case "$PART" in
b9)
  rows
  grep -h -E "timeline|idle |layers \(each" $R/tl-ds.txt $R/tl-glm.txt | head -16 >> $R/summary.txt; save ;;
sh)
  (cd engine/gpu && TILERT_GPU_TIMING=1 TILERT_SHARD_REPORT=$R/shard-timing.txt timeout 300 $D/engine.test -test.v -test.count=1 \
    -test.timeout=290s -test.run '^TestGPUShardLayerTiming$' > $R/shard.log 2>&1; echo "rc=$?" >> $R/shard.log)
  cnt shard; grep -E "MoE layer|with its communication|projection" $R/shard-timing.txt >> $R/summary.txt; save
  MTP=1 bn glm-5 8192 1,4 glm-mtp ;;
*) echo "usage: s51.sh b9|sh" >&2; exit 2 ;;
esac
