# Session 23's device plan (issue 10). Binaries of main (tilert; kernels.test, engine.test, decode.test, cuda.test,
# cupti.test for `check`) in .device/next, xz'd or not (the build line in docs/measured/next/README.md). Ask `status`.
# Usage: bash docs/measured/next/s23.sh ab|check|final
#  ab (RAN as session 23 call A, 334 s, on 4539646): helper routein's checks, then one A/B/A run at 8192: the routing
#        inside the experts' gate/up (TILERT_GPU_ROUTE_IN_GEMV=1, since removed) at 1 and 4 slots on both models,
#        q_b's side cap 2 / 0 and the late fork on DeepSeek-V3.2 dims at 1 slot, then the routed chain's graph timing.
#  check (~8 min, two parts in parallel): make gpu-check's correctness parts whole (the kernel checks: the top-k
#        changed in session 22; the engine's ^TestGPU; the decode node's handoff; cuda; cupti).
#  side (~4 min; session 23 call D): the MoE fork's settings again on today's defaults, A/B/A at 8192, 1 slot, both
#        models: the shared expert on the main stream (TILERT_GPU_SIDE=q), its side GEMVs uncapped (SIDE_CAP=sh=0),
#        the side stream's launches programmatic (SIDE_PDL=1); last measured in sessions 11-16 on older defaults.
#  final (~5 min): the README's rows on the last default (both models, 8192 and 131072, 1 and 4 slots; the MTP
#        step), GLM-5's q chain forked at q_a again (the one-block top-k is 6 us now: session 17's late fork for
#        GLM-5 at 8192 was measured against the 13 us one), uncapped and capped, A/B/A; a traced step of each model.
set -x
if ls .device/next/*.xz >/dev/null 2>&1; then (cd .device/next && for f in *.xz; do xz -d -f "$f"; done); fi
chmod +x .device/next/* 2>/dev/null
D=$PWD/.device/next
P=$1; R=/tmp/s23-$P; rm -rf $R; mkdir -p $R
export TILERT_KERNEL_CACHE=/tmp/tilert-kernels
save() { tar czf $OUT/s23-$P.tgz -C $R .; cp $R/summary.txt $OUT/summary-$P.txt 2>/dev/null; }
bn() { local m=$1 c=$2 b=$3 n=$4; shift 4; env X=1 "$@" timeout 150 $D/tilert bench decode --device cuda --dummy-weights $m --layers 9 --context $c --batches $b ${MTP:+--mtp} ${JS:+--json $R/$n.json} ${TL:+--timeline $R/$n.json} > $R/$n.txt 2>&1; echo "rc=$?" >> $R/$n.txt; grep -E "^ +[0-9]+ +[0-9]+ +[0-9.]+ " $R/$n.txt | sed "s|^|$n $* |" | tee -a $R/summary.txt; save; }
cnt() { echo "$1: $(grep -c -- '--- PASS' $R/$1.log) PASS, $(grep -c -- '--- FAIL' $R/$1.log) FAIL, $(grep -c -- '--- SKIP' $R/$1.log) SKIP; $(tail -1 $R/$1.log)" | tee -a $R/summary.txt; grep -E -- '--- FAIL' -A8 $R/$1.log | head -40 >> $R/summary.txt; }
timeout 120 $D/tilert bench decode --device cuda --dummy-weights glm-5 --layers 1 --context 1024 --batches 1 > $R/warm.txt 2>&1
case "$P" in
ab)
  (cd cuda/kernels && timeout 240 $D/kernels.test -test.v -test.count=1 -test.timeout=4m -test.run '^(TestKernelRouteIn|TestKernelSmallFast|TestKernelMoERoute|TestKernelTileVariantsBitwise)$' > $R/kernels.log 2>&1; echo "rc=$?" >> $R/kernels.log) &
  (cd engine/gpu && timeout 240 $D/engine.test -test.v -test.count=1 -test.timeout=4m -test.run '^(TestGPURouteInEqual|TestGPUGreedyMatchesCPURouteIn)$' > $R/engine.log 2>&1; echo "rc=$?" >> $R/engine.log) &
  wait
  for f in kernels engine; do cnt $f; done; save
  bn deepseek-v3.2 8192 1 ds-A
  bn deepseek-v3.2 8192 1 ds-route TILERT_GPU_ROUTE_IN_GEMV=1
  bn deepseek-v3.2 8192 1 ds-cap2 TILERT_GPU_SIDE_CAP=q=2
  bn deepseek-v3.2 8192 1 ds-cap0 TILERT_GPU_SIDE_CAP=q=0
  bn deepseek-v3.2 8192 1 ds-late TILERT_GPU_SIDE_Q_AT=topk-all
  bn deepseek-v3.2 8192 1 ds-A2
  bn glm-5 8192 1 glm-A
  bn glm-5 8192 1 glm-route TILERT_GPU_ROUTE_IN_GEMV=1
  bn glm-5 8192 1 glm-A2
  bn deepseek-v3.2 8192 4 ds4-A
  bn deepseek-v3.2 8192 4 ds4-route TILERT_GPU_ROUTE_IN_GEMV=1
  bn glm-5 8192 4 glm4-A
  bn glm-5 8192 4 glm4-route TILERT_GPU_ROUTE_IN_GEMV=1
  (cd cuda/kernels && TILERT_GPU_TIMING=1 timeout 100 $D/kernels.test -test.v -test.count=1 -test.timeout=2m -test.run '^TestKernelRouteInTiming$' > $R/timing.log 2>&1; echo "rc=$?" >> $R/timing.log)
  cnt timing; grep -E ' us ' $R/timing.log | sed 's/^ *[a-z_]*_test.go:[0-9]*: //' >> $R/summary.txt
  save ;;
check)
  export TILERT_GPU_REPORT=$R/report.txt TILERT_ENGINE_REPORT=$R/engine-report.txt
  (cd cuda && timeout 120 $D/cuda.test -test.v -test.count=1 -test.timeout=2m > $R/cuda.log 2>&1; echo "rc=$?" >> $R/cuda.log)
  (cd cuda/kernels && timeout 480 $D/kernels.test -test.v -test.count=1 -test.timeout=9m > $R/kernels.log 2>&1; echo "rc=$?" >> $R/kernels.log) &
  (cd engine/gpu && timeout 480 $D/engine.test -test.v -test.count=1 -test.timeout=9m -test.run '^TestGPU' > $R/engine.log 2>&1; echo "rc=$?" >> $R/engine.log) &
  wait
  (cd roles/decode && timeout 90 $D/decode.test -test.v -test.count=1 -test.timeout=2m -test.run 'TestHandoff(EqualsLocalGeneration|MTPLen)/cuda' > $R/decode.log 2>&1; echo "rc=$?" >> $R/decode.log)
  (cd cuda/cupti && timeout 60 $D/cupti.test -test.v -test.count=1 -test.timeout=1m > $R/cupti.log 2>&1; echo "rc=$?" >> $R/cupti.log)
  for f in cuda kernels engine decode cupti; do cnt $f; done
  save ;;
final)
  JS=1 bn deepseek-v3.2 8192,131072 1,4 ds
  JS=1 bn glm-5 8192,131072 1,4 glm
  MTP=1 bn deepseek-v3.2 8192 1 ds-mtp
  bn glm-5 8192 1 glm-A
  bn glm-5 8192 1 glm-qa TILERT_GPU_SIDE_Q_AT=qa
  bn glm-5 8192 1 glm-qa-cap2 TILERT_GPU_SIDE_Q_AT=qa TILERT_GPU_SIDE_CAP=q=2
  bn glm-5 8192 1 glm-A2
  TL=1 bn deepseek-v3.2 8192 1 tl-ds
  TL=1 bn glm-5 8192 1 tl-glm
  xz -T4 $R/tl-*.json 2>/dev/null; save ;;
side)
  for m in deepseek-v3.2 glm-5; do
    bn $m 8192 1 $m-A
    bn $m 8192 1 $m-sideq TILERT_GPU_SIDE=q
    bn $m 8192 1 $m-sh0 TILERT_GPU_SIDE_CAP=sh=0
    bn $m 8192 1 $m-sidepdl TILERT_GPU_SIDE_PDL=1
    bn $m 8192 1 $m-A2
  done ;;
*) echo "usage: s23.sh ab|check|final|side" >&2; exit 2 ;;
esac
