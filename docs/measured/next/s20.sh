# Session 19's plan for the next device session (issue 10; NOT RUN). Binaries of main (tilert, kernels.test,
# engine.test; the build line in docs/measured/next/README.md), xz'd or not, in .device/next. Ask `status` first.
# Usage: bash docs/measured/next/s20.sh kernels|steps
#  kernels (~6 min cold): every kernel check and timing of cuda/kernels (gpu-check's kernel part, last run whole in
#        session 12; session 19 changed mla_prefill_wg2's block and added mla_decode_wg2), TILERT_GPU_TIMING=1.
#  steps (~4 min): session 19's defaults (mla_decode_wg2, the group on u4 from 2 rows) where they were not stepped:
#        DeepSeek-V3.2 / GLM-5 dims at 131072 (1 and 4 slots), the MTP step, and the 1- and 4-slot in-graph profiles
#        at 8192 (where the time goes now).
set -x
if ls .device/next/*.xz >/dev/null 2>&1; then (cd .device/next && for f in *.xz; do xz -d -f "$f"; done); fi
chmod +x .device/next/* 2>/dev/null
D=$PWD/.device/next
P=$1; R=/tmp/s20-$P; rm -rf $R; mkdir -p $R
export TILERT_KERNEL_CACHE=/tmp/tilert-kernels
save() { tar czf $OUT/s20-$P.tgz -C $R .; cp $R/summary.txt $OUT/summary-$P.txt 2>/dev/null; }
bn() { local m=$1 c=$2 b=$3 n=$4; shift 4; env X=1 "$@" timeout 120 $D/tilert bench decode --device cuda --dummy-weights $m --layers 9 --context $c --batches $b ${MTP:+--mtp} ${PROF:+--profile} > $R/$n.txt 2>&1; echo "rc=$?" >> $R/$n.txt; grep -E "^ +[0-9]+ +[0-9]+ +[0-9.]+ " $R/$n.txt | sed "s|^|$n $* |" | tee -a $R/summary.txt; save; }
timeout 120 $D/tilert bench decode --device cuda --dummy-weights glm-5 --layers 1 --context 1024 --batches 1,4 > $R/warm.txt 2>&1
case "$P" in
kernels)
  (cd cuda/kernels && TILERT_GPU_TIMING=1 timeout 540 $D/kernels.test -test.v -test.count=1 -test.timeout=9m > $R/kernels.log 2>&1; echo "rc=$?" >> $R/kernels.log)
  echo "kernels: $(grep -c '^--- PASS' $R/kernels.log) PASS, $(grep -c '^--- FAIL' $R/kernels.log) FAIL, $(grep -c '^--- SKIP' $R/kernels.log) SKIP; $(tail -1 $R/kernels.log)" | tee -a $R/summary.txt
  grep -E "^--- FAIL" -A5 $R/kernels.log | head -40 >> $R/summary.txt; save ;;
steps)
  PROF=1 bn deepseek-v3.2 8192 1,4 ds-prof
  bn deepseek-v3.2 131072 1,4 ds-long
  bn glm-5 131072 1,4 glm-long
  MTP=1 bn deepseek-v3.2 8192 1 ds-mtp
  MTP=1 bn deepseek-v3.2 8192 1 ds-mtp-tcf2 TILERT_GPU_MLA_WG=0 ;;
*) echo "usage: s20.sh kernels|steps" >&2; exit 2 ;;
esac
