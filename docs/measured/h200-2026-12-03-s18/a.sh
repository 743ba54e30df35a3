# Session 17's plan for the next device session (issue 10; NOT RUN). Binaries of main (tilert at least; the build
# line in docs/measured/next/README.md), xz'd or not, in .device/next. Ask `status` first: a refused start costs ~90 s.
# Usage: bash docs/measured/next/s18.sh prof|rows|ds
#  prof (~4 min): the in-graph profile under today's defaults (late q fork, a890bb4), 1 and 4 slots, both models,
#        8192 and 131072: where the step's remaining ~0.8 ms over the floor goes now (session 14 call E is the last
#        one: MLA ~20 us a layer, the grouped inputs +5, add + norms ~6.5, router + routing ~8, absorbs ~5.6).
#  rows (~3 min): the late q fork at several rows (auto keeps q_a there; not measured): 4 slots at 131072 with
#        TILERT_GPU_SIDE_Q_AT=topk, capped (its default at several rows) and uncapped (q=0), against the default.
#  ds   (~3 min): s16.sh bench's DeepSeek-V3.2 rows that did not run: q_b pinned to _o4 (capped, open), q=2.
set -x
if ls .device/next/*.xz >/dev/null 2>&1; then (cd .device/next && for f in *.xz; do xz -d -f "$f"; done); fi
chmod +x .device/next/* 2>/dev/null
D=$PWD/.device/next
P=$1; R=/tmp/s18-$P; rm -rf $R; mkdir -p $R
export TILERT_KERNEL_CACHE=/tmp/tilert-kernels
save() { tar czf $OUT/s18-$P.tgz -C $R .; cp $R/summary.txt $OUT/summary-$P.txt 2>/dev/null; }
warm() { timeout 120 $D/tilert bench decode --device cuda --dummy-weights glm-5 --layers 1 --context 1024 --batches 1 > $R/warm.txt 2>&1; }
bn() { local m=$1 c=$2 b=$3 n=$4; shift 4; env X=1 "$@" timeout 90 $D/tilert bench decode --device cuda --dummy-weights $m --layers 9 --context $c --batches $b > $R/$n.txt 2>&1; echo "rc=$?" >> $R/$n.txt; grep -A1 "p50 ms" $R/$n.txt | tail -1 | sed "s|^|$n $* |" | tee -a $R/summary.txt; save; }
case "$P" in
prof)
  warm
  for m in deepseek-v3.2 glm-5; do for c in 8192 131072; do
    timeout 120 $D/tilert bench decode --device cuda --dummy-weights $m --layers 9 --context $c --batches 1,4 --profile > $R/profile-$m-$c.txt 2>&1
    echo "rc=$?" >> $R/profile-$m-$c.txt; grep -A3 "p50 ms" $R/profile-$m-$c.txt | sed "s|^|$m $c |" >> $R/summary.txt; save
  done; done ;;
rows)
  warm
  bn deepseek-v3.2 131072 4 ds-4-long
  bn deepseek-v3.2 131072 4 ds-4-long-topk TILERT_GPU_SIDE_Q_AT=topk
  bn deepseek-v3.2 131072 4 ds-4-long-topk-open TILERT_GPU_SIDE_Q_AT=topk TILERT_GPU_SIDE_CAP=q=0,sh=1
  bn glm-5 131072 4 glm-4-long
  bn glm-5 131072 4 glm-4-long-topk TILERT_GPU_SIDE_Q_AT=topk
  bn glm-5 131072 4 glm-4-long-topk-open TILERT_GPU_SIDE_Q_AT=topk TILERT_GPU_SIDE_CAP=q=0,sh=1 ;;
ds)
  warm
  bn deepseek-v3.2 8192 1 ds-base
  bn deepseek-v3.2 8192 1 ds-qb-o4-capped TILERT_GPU_TILE_PLANS=24576x1536=G64/R8_o4/B0
  bn deepseek-v3.2 8192 1 ds-qb-o4-open TILERT_GPU_TILE_PLANS=24576x1536=G64/R8_o4/B0 TILERT_GPU_SIDE_CAP=q=0,sh=1
  bn deepseek-v3.2 8192 1 ds-q2 TILERT_GPU_SIDE_CAP=q=2,sh=1
  bn deepseek-v3.2 8192 1 ds-base2 ;;
*) echo "usage: s18.sh prof|rows|ds" >&2; exit 2 ;;
esac
