# The device plans' shared preamble (session 23): sourced by a plan after it sets NAME (the plan's name, for
# /tmp/NAME-PART and $OUT/NAME-PART.tgz) with the part as $1 (then $PART: session 30 call H lost its archive when an
# inline command set P, the name before). Decompresses the binaries that travelled xz'd in
# .device/next, and defines save (the part's results to $OUT), bn (one `tilert bench decode` row, 9 MoE layers,
# dummy weights: bn MODEL CONTEXTS BATCHES NAME [VAR=value ...]; MTP=1, JS=1, TL=1 add --mtp, --json, --timeline;
# SAMP="--temperature ..." adds sampling flags)
# cnt (a test log's PASS / FAIL / SKIP counts into the summary), tst, and the two parts every session runs: gpucheck
# and rows (below). Warms the kernel cache.
set -x
if ls .device/next/*.xz >/dev/null 2>&1; then (cd .device/next && for f in *.xz; do xz -d -f "$f"; done); fi
chmod +x .device/next/* 2>/dev/null
D=$PWD/.device/next
PART=$1; R=/tmp/$NAME-$PART; rm -rf $R; mkdir -p $R
export TILERT_KERNEL_CACHE=/tmp/tilert-kernels
# The 9-layer rows need an H200's memory; a call for an H200 may land on an H100 (80 GB: session 39 call A ran out of
# memory there). Sessions 39-46 fell back to LAYERS=3 there; since session 47 a card under 100 GB runs the 9 layers
# with --one-expert-bank (BANK=1: every MoE layer reads one bank of routed experts, the same bytes a step, ~21 GB;
# s47.sh bk measured it the same step within 5 us) unless LAYERS is set (LAYERS=3: the rows of sessions 39-46).
if [ -z "$LAYERS" ] && [ -z "$BANK" ] && [ "$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1)" -lt 100000 ]; then export BANK=1; fi
echo "LAYERS=${LAYERS:-9}${BANK:+ one expert bank} on $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)" >> $R/summary.txt
save() { tar czf $OUT/$NAME-$PART.tgz -C $R .; cp $R/summary.txt $OUT/summary-$PART.txt 2>/dev/null; }
bn() { local m=$1 c=$2 b=$3 n=$4; shift 4; env X=1 "$@" timeout 150 $D/tilert bench decode --device cuda --dummy-weights $m --layers ${LAYERS:-9} ${BANK:+--one-expert-bank} --context $c --batches $b ${SAMP} ${MTP:+--mtp} ${JS:+--json $R/$n.json} ${TL:+--timeline $R/$n.json} > $R/$n.txt 2>&1; echo "rc=$?" >> $R/$n.txt; grep -E "^ +[0-9]+ +[0-9]+ +[0-9.]+ " $R/$n.txt | sed "s|^|$n $* |" | tee -a $R/summary.txt; save; }
# abab MODEL CONTEXTS BATCHES NAME VAR=value...: the default and the variant in turn, twice (NAME-A, NAME-B, NAME-A2,
# NAME-B2), the same-run A/B every switch gets before it changes a default.
abab() { local m=$1 c=$2 b=$3 n=$4; shift 4; bn $m $c $b $n-A; bn $m $c $b $n-B "$@"; bn $m $c $b $n-A2; bn $m $c $b $n-B2 "$@"; }
cnt() { echo "$1: $(grep -c -- '--- PASS' $R/$1.log) PASS, $(grep -c -- '--- FAIL' $R/$1.log) FAIL, $(grep -c -- '--- SKIP' $R/$1.log) SKIP; $(tail -1 $R/$1.log)" | tee -a $R/summary.txt; grep -E -- '--- FAIL' -A8 $R/$1.log | head -40 >> $R/summary.txt; }
timeout 120 $D/tilert bench decode --device cuda --dummy-weights glm-5 --layers 1 --context 1024 --batches 1 > $R/warm.txt 2>&1
# tst NAME DIR SECONDS [RUN]: one test binary $D/NAME.test run in DIR (verbose, -test.run RUN if given, -test.skip
# $TSKIP if set) into $R/NAME.log with its exit status last; a binary that did not travel fails fast with rc=127. An
# earlier NAME.log is kept under a timestamped name (session 34 lost a whole kernel log to a later run's).
tst() { local n=$1 dir=$2 t=$3; [ -e $R/$n.log ] && mv $R/$n.log $R/$n.$(date +%s%N).log; (cd $dir && timeout $t $D/$n.test -test.v -test.count=1 -test.timeout=$((t - 10))s ${4:+-test.run "$4"} ${TSKIP:+-test.skip "$TSKIP"} > $R/$n.log 2>&1; echo "rc=$?" >> $R/$n.log); }
# gpucheck: make gpu-check's correctness parts, counted into the summary, in two halves (the carry once held at most
# three xz'd binaries with the working tree; sessions 26-40 carried all six, ~22 MB xz'd; in session 41 the six with
# the 41 MiB tracked tree were refused as over the 64 MiB carry, so decode.test travels in a call of its own): check1 the kernel checks (the NVRTC compile checks skipped: CI runs
# them) and the engine's ^TestGPU side by side (kernels.test, engine.test); check2 the decode node's handoff on cuda,
# cuda and cupti (decode.test, cuda.test, cupti.test).
check1() {
  export TILERT_GPU_REPORT=$R/report.txt TILERT_ENGINE_REPORT=$R/engine-report.txt
  TSKIP='^TestNVRTC' tst kernels cuda/kernels 400 & tst engine engine/gpu 400 '^TestGPU' & wait
  for f in kernels engine; do cnt $f; done; save
}
check2() {
  tst decode roles/decode 90 'TestHandoff(EqualsLocalGeneration|MTPLen)/cuda'
  tst cuda cuda 120
  tst cupti cuda/cupti 60
  for f in decode cuda cupti; do cnt $f; done; save
}
gpucheck() { check1; check2; }
# rows: the README's rows (both models, 8192 and 131072, 1 and 4 slots, JSON), the MTP step and a traced step of each.
rows() {
  JS=1 bn deepseek-v3.2 8192,131072 1,4 ds
  JS=1 bn glm-5 8192,131072 1,4 glm
  MTP=1 bn deepseek-v3.2 8192 1 ds-mtp
  MTP=1 bn deepseek-v3.2 8192 4 ds-mtp4   # session 46: the MTP head once over its rows
  TL=1 bn deepseek-v3.2 8192 1 tl-ds
  TL=1 bn glm-5 8192 1 tl-glm
  xz -T4 $R/tl-*.json 2>/dev/null; save
}
