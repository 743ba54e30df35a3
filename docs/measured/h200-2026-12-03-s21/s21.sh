# Session 20's plan for the next device session (issue 10; NOT RUN). Binaries of main (tilert, kernels.test) in
# .device/next, xz'd or not (the build line in docs/measured/next/README.md). Ask `status` first.
# Usage: bash docs/measured/next/s21.sh slots|pdl|check|final|glm|kernels|timeline
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
bn() { local m=$1 c=$2 b=$3 n=$4; shift 4; env X=1 "$@" timeout 120 $D/tilert bench decode --device cuda --dummy-weights $m --layers 9 --context $c --batches $b ${MTP:+--mtp} ${PROF:+--profile} ${JS:+--json $R/$n.json} > $R/$n.txt 2>&1; echo "rc=$?" >> $R/$n.txt; grep -E "^ +[0-9]+ +[0-9]+ +[0-9.]+ " $R/$n.txt | sed "s|^|$n $* |" | tee -a $R/summary.txt; save; }
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
pdl)
  # Call A found GLM-5 at 4 slots 5.509 ms with mla_decode_wg2b against 5.319 without (the 4 x 64-head blocks are one
  # tile each): is it the kernel or its programmatic launch (an early-resident grid of 128 blocks of 226 KiB)?
  NOWG=mla_decode_tcf,gemv_mid,absorb_v
  PROF=1 bn glm-5 8192 4 glm-default
  PROF=1 bn glm-5 8192 4 glm-wg2b-plain TILERT_GPU_PDL_MORE=$NOWG
  PROF=1 bn glm-5 8192 4 glm-wg2 TILERT_GPU_MLA_WG2B=0
  MTP=1 bn deepseek-v3.2 8192 1 ds-mtp-default
  MTP=1 bn deepseek-v3.2 8192 1 ds-mtp-wg2b-plain TILERT_GPU_PDL_MORE=$NOWG
  MTP=1 bn deepseek-v3.2 8192 1 ds-mtp-wg2 TILERT_GPU_MLA_WG2B=0
  bn deepseek-v3.2 8192 1,4 ds-wg2b-plain TILERT_GPU_PDL_MORE=$NOWG
  bn glm-5 131072 1,4 glm-long-default
  bn glm-5 131072 1,4 glm-long-wg2 TILERT_GPU_MLA_WG2B=0
  bn glm-5 8192 4 glm-default2 ;;
final)
  # Session 21's defaults (mla_decode_wg2b at one row of 128 heads only): the README's tables, JSON, and GLM-5 at one
  # row on mla_decode_wg2b (TILERT_GPU_MLA_WG=1; session 20 call B0 read 2.723 against 2.740 ms) A/B/A.
  JS=1 bn deepseek-v3.2 8192,131072 1,4 ds
  JS=1 bn glm-5 8192,131072 1,4 glm
  MTP=1 bn deepseek-v3.2 8192 1 ds-mtp
  bn glm-5 8192,131072 1 glm-wg1 TILERT_GPU_MLA_WG=1
  bn glm-5 8192,131072 1 glm-default ;;
glm)
  # GLM-5 dims on session 21's last default (mla_decode_wg2b at one row of 64 heads): the README's rows, then one
  # traced step at 8192, 1 slot (a separate process: a traced row slows the rows after it a little).
  JS=1 bn glm-5 8192,131072 1,4 glm
  timeout 120 $D/tilert bench decode --device cuda --dummy-weights glm-5 --layers 9 --context 8192 --batches 1 --timeline $R/tl-glm.json > $R/tl-glm.txt 2>&1; echo "rc=$?" >> $R/tl-glm.txt
  xz -T4 $R/tl-*.json 2>/dev/null; save ;;
check)
  # make gpu-check's correctness parts on main's binaries (kernels, cuda, engine, decode .test in .device/next):
  # the kernel checks (no timing tests) beside the engine's ^TestGPU, then the decode node's handoff; and where
  # CUPTI lives on this machine (an in-graph timeline's library) with its kernel record's layout.
  export TILERT_GPU_REPORT=$R/report.txt TILERT_ENGINE_REPORT=$R/engine-report.txt TILERT_SHARD_REPORT=$R/shard.txt
  (find / -xdev \( -name 'libcupti.so*' -o -name cupti_activity.h -o -name 'cupti_*.h' \) 2>/dev/null | head -40 > $R/cupti-find.txt
   H=$(grep -m1 'cupti_activity.h$' $R/cupti-find.txt); [ -n "$H" ] && cp "$H" $R/ && cp "$(dirname $H)"/cupti_result.h "$(dirname $H)"/cupti_activity_deprecated.h $R/ 2>/dev/null; true)
  (cd cuda && timeout 120 $D/cuda.test -test.v -test.count=1 -test.timeout=2m > $R/cuda.log 2>&1; echo "rc=$?" >> $R/cuda.log)
  (cd cuda/kernels && timeout 420 $D/kernels.test -test.v -test.count=1 -test.timeout=9m > $R/kernels.log 2>&1; echo "rc=$?" >> $R/kernels.log) &
  (cd engine/gpu && timeout 420 $D/engine.test -test.v -test.count=1 -test.timeout=9m -test.run '^TestGPU' > $R/engine.log 2>&1; echo "rc=$?" >> $R/engine.log) &
  wait
  (cd roles/decode && timeout 90 $D/decode.test -test.v -test.count=1 -test.timeout=2m -test.run 'TestHandoff(EqualsLocalGeneration|MTPLen)/cuda' > $R/decode.log 2>&1; echo "rc=$?" >> $R/decode.log)
  for f in cuda kernels engine decode; do
    echo "$f: $(grep -c -- '--- PASS' $R/$f.log) PASS, $(grep -c -- '--- FAIL' $R/$f.log) FAIL, $(grep -c -- '--- SKIP' $R/$f.log) SKIP; $(tail -1 $R/$f.log)" | tee -a $R/summary.txt
    grep -E -- '--- FAIL' -A5 $R/$f.log | head -30 >> $R/summary.txt
  done
  save ;;
timeline)
  # The step as the GPU ran it (CUPTI kernel records, cuda/cupti; session 21): the tracer's GPU checks, then one
  # traced step per row, both models at 8192 (1 and 4 slots for DeepSeek-V3.2 dims).
  (cd cuda/cupti && timeout 120 $D/cupti.test -test.run '^(TestGPUTraceGraph|TestLibrary)$' -test.count=1 -test.v -test.timeout=2m > $R/cupti.log 2>&1; echo "rc=$?" >> $R/cupti.log)
  (cd engine/gpu && timeout 200 $D/engine.test -test.run '^TestGPUTimelineStep$' -test.count=1 -test.v -test.timeout=3m > $R/engine-tl.log 2>&1; echo "rc=$?" >> $R/engine-tl.log)
  for f in cupti engine-tl; do echo "$f: $(grep -c -- '--- PASS' $R/$f.log) PASS, $(grep -c -- '--- FAIL' $R/$f.log) FAIL, $(grep -c -- '--- SKIP' $R/$f.log) SKIP; $(tail -1 $R/$f.log)" | tee -a $R/summary.txt; done
  save
  timeout 150 $D/tilert bench decode --device cuda --dummy-weights deepseek-v3.2 --layers 9 --context 8192 --batches 1,4 --timeline $R/tl-ds.json > $R/tl-ds.txt 2>&1; echo "rc=$?" >> $R/tl-ds.txt; save
  timeout 120 $D/tilert bench decode --device cuda --dummy-weights glm-5 --layers 9 --context 8192 --batches 1 --timeline $R/tl-glm.json > $R/tl-glm.txt 2>&1; echo "rc=$?" >> $R/tl-glm.txt
  xz -T4 $R/tl-*.json 2>/dev/null; save ;;
*) echo "usage: s21.sh slots|pdl|check|final|glm|kernels|timeline" >&2; exit 2 ;;
esac
