# Session 20's plan for the next device session (issue 10; NOT RUN). Binaries of main (tilert, kernels.test) in
# .device/next, xz'd or not (the build line in docs/measured/next/README.md). Ask `status` first.
# Usage: bash docs/measured/next/s21.sh slots|kernels
#  slots (~4 min cold): the 4-slot steps at 8192 on session 20's defaults against each of its switches in the same
#        run (GLM-5 dims read 5.507 ms in session 20 call C against 5.360 in session 19 on another machine, while both
#        of its changed kernels measured faster at 4 rows), both models.
#  kernels (~6 min cold): every kernel check of cuda/kernels (gpu-check's kernel half, last whole in session 12).
set -x
if ls .device/next/*.xz >/dev/null 2>&1; then (cd .device/next && for f in *.xz; do xz -d -f "$f"; done); fi
chmod +x .device/next/* 2>/dev/null
D=$PWD/.device/next
P=$1; R=/tmp/s21-$P; rm -rf $R; mkdir -p $R
export TILERT_KERNEL_CACHE=/tmp/tilert-kernels
save() { tar czf $OUT/s21-$P.tgz -C $R .; cp $R/summary.txt $OUT/summary-$P.txt 2>/dev/null; }
bn() { local m=$1 c=$2 b=$3 n=$4; shift 4; env X=1 "$@" timeout 120 $D/tilert bench decode --device cuda --dummy-weights $m --layers 9 --context $c --batches $b > $R/$n.txt 2>&1; echo "rc=$?" >> $R/$n.txt; grep -E "^ +[0-9]+ +[0-9]+ +[0-9.]+ " $R/$n.txt | sed "s|^|$n $* |" | tee -a $R/summary.txt; save; }
timeout 120 $D/tilert bench decode --device cuda --dummy-weights glm-5 --layers 1 --context 1024 --batches 1 > $R/warm.txt 2>&1
case "$P" in
slots)
  for m in glm-5 deepseek-v3.2; do
    bn $m 8192 1,4 $m-default
    bn $m 8192 1,4 $m-nonorm TILERT_GPU_MOE_NORM_FUSED=0
    bn $m 8192 1,4 $m-wg2 TILERT_GPU_MLA_WG2B=0
    bn $m 8192 1,4 $m-default2
  done ;;
kernels)
  (cd cuda/kernels && timeout 540 $D/kernels.test -test.v -test.count=1 -test.timeout=9m > $R/kernels.log 2>&1; echo "rc=$?" >> $R/kernels.log)
  echo "kernels: $(grep -c '^--- PASS' $R/kernels.log) PASS, $(grep -c '^--- FAIL' $R/kernels.log) FAIL, $(grep -c '^--- SKIP' $R/kernels.log) SKIP; $(tail -1 $R/kernels.log)" | tee -a $R/summary.txt
  grep -E "^--- FAIL" -A5 $R/kernels.log | head -40 >> $R/summary.txt; save ;;
*) echo "usage: s21.sh slots|kernels" >&2; exit 2 ;;
esac
