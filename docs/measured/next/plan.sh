# The device plans' shared preamble (session 23): sourced by a plan after it sets NAME (the plan's name, for
# /tmp/NAME-PART and $OUT/NAME-PART.tgz) with the part as $1. Decompresses the binaries that travelled xz'd in
# .device/next, and defines save (the part's results to $OUT), bn (one `tilert bench decode` row, 9 MoE layers,
# dummy weights: bn MODEL CONTEXTS BATCHES NAME [VAR=value ...]; MTP=1, JS=1, TL=1 add --mtp, --json, --timeline)
# and cnt (a test log's PASS / FAIL / SKIP counts into the summary). Ends by warming the kernel cache.
set -x
if ls .device/next/*.xz >/dev/null 2>&1; then (cd .device/next && for f in *.xz; do xz -d -f "$f"; done); fi
chmod +x .device/next/* 2>/dev/null
D=$PWD/.device/next
P=$1; R=/tmp/$NAME-$P; rm -rf $R; mkdir -p $R
export TILERT_KERNEL_CACHE=/tmp/tilert-kernels
save() { tar czf $OUT/$NAME-$P.tgz -C $R .; cp $R/summary.txt $OUT/summary-$P.txt 2>/dev/null; }
bn() { local m=$1 c=$2 b=$3 n=$4; shift 4; env X=1 "$@" timeout 150 $D/tilert bench decode --device cuda --dummy-weights $m --layers 9 --context $c --batches $b ${MTP:+--mtp} ${JS:+--json $R/$n.json} ${TL:+--timeline $R/$n.json} > $R/$n.txt 2>&1; echo "rc=$?" >> $R/$n.txt; grep -E "^ +[0-9]+ +[0-9]+ +[0-9.]+ " $R/$n.txt | sed "s|^|$n $* |" | tee -a $R/summary.txt; save; }
cnt() { echo "$1: $(grep -c -- '--- PASS' $R/$1.log) PASS, $(grep -c -- '--- FAIL' $R/$1.log) FAIL, $(grep -c -- '--- SKIP' $R/$1.log) SKIP; $(tail -1 $R/$1.log)" | tee -a $R/summary.txt; grep -E -- '--- FAIL' -A8 $R/$1.log | head -40 >> $R/summary.txt; }
timeout 120 $D/tilert bench decode --device cuda --dummy-weights glm-5 --layers 1 --context 1024 --batches 1 > $R/warm.txt 2>&1
