# Session 22, call B (issue 10): the session's three kernels on the H200 (NOT RUN when written). Binaries of main
# (tilert, kernels.test, engine.test) in .device/next, xz'd or not (the build line in docs/measured/next/README.md).
# Usage: bash docs/measured/next/s22b.sh check|ab
#  check (~3 min): the new kernels' GPU checks against their CPU references and the old kernels, their graph-timed
#        tests, and the engine's GPU checks that run them in the step (beside the kernel checks).
#        - topk_radix_one_w* (helper topk1): the one-block top-k with fewer scans and skipped passes;
#        - gemv_bf16_smem_r* (helper router): the MoE router's weights staged on chip before its PDL wait;
#        - absorb_v_fastw_rw*: the one-row W_UV product's weights in registers before its PDL wait.
#  ab (~5 min): the decode step at 8192, 1 slot, both models: all three new (default) against each switched back
#        alone and all three back, then the default again.
set -x
if ls .device/next/*.xz >/dev/null 2>&1; then (cd .device/next && for f in *.xz; do xz -d -f "$f"; done); fi
chmod +x .device/next/* 2>/dev/null
D=$PWD/.device/next
P=$1; R=/tmp/s22b-$P; rm -rf $R; mkdir -p $R
export TILERT_KERNEL_CACHE=/tmp/tilert-kernels
save() { tar czf $OUT/s22b-$P.tgz -C $R .; cp $R/summary.txt $OUT/summary-b-$P.txt 2>/dev/null; }
bn() { local m=$1 c=$2 b=$3 n=$4; shift 4; env X=1 "$@" timeout 120 $D/tilert bench decode --device cuda --dummy-weights $m --layers 9 --context $c --batches $b ${JS:+--json $R/$n.json} ${TL:+--timeline $R/$n.json} > $R/$n.txt 2>&1; echo "rc=$?" >> $R/$n.txt; grep -E "^ +[0-9]+ +[0-9]+ +[0-9.]+ " $R/$n.txt | sed "s|^|$n $* |" | tee -a $R/summary.txt; save; }
cnt() { echo "$1: $(grep -c -- '--- PASS' $R/$1.log) PASS, $(grep -c -- '--- FAIL' $R/$1.log) FAIL, $(grep -c -- '--- SKIP' $R/$1.log) SKIP; $(tail -1 $R/$1.log)" | tee -a $R/summary.txt; grep -E -- '--- FAIL' -A8 $R/$1.log | head -40 >> $R/summary.txt; }
OLD="TILERT_GPU_TOPK_ONE=v1 TILERT_GPU_ROUTER_SMEM=0 TILERT_GPU_ABSORB_V_PRE=0"
case "$P" in
check)
  KC='^(TestKernelTopKOneW|TestKernelIndexer.*|TestKernelTopKFast|TestKernelSlotRows|TestNVRTCCompilesTopKOne|TestTopKOneWModel|TestTopKOneWKPT|TestKernelGemvSmem|TestKernelGemvWide|TestPDL.*|TestGemvSmemPlan|TestKernelAbsorbFast|TestAbsorbFastKernels|TestNVRTCCompilesAbsorbKernels)$'
  (cd cuda/kernels && timeout 200 $D/kernels.test -test.v -test.count=1 -test.timeout=4m -test.run "$KC" > $R/kernels.log 2>&1; echo "rc=$?" >> $R/kernels.log) &
  (cd engine/gpu && timeout 200 $D/engine.test -test.v -test.count=1 -test.timeout=4m -test.run '^(TestGPURouterSmem|TestGPUGreedyMatchesCPU|TestGPUMoENormFusedEqual|TestGPUGraphsEqualEager|TestGPUSideStreamSameTokens|TestGPUPipelineMatches|TestGPUGreedyMatchesCPUMoENorm|TestGPUMLADecodeWG|TestGPUGreedyMatchesCPUBF16)$' > $R/engine.log 2>&1; echo "rc=$?" >> $R/engine.log) &
  wait
  (cd cuda/kernels && TILERT_GPU_TIMING=1 timeout 150 $D/kernels.test -test.v -test.count=1 -test.timeout=3m -test.run '^(TestKernelTimingTopKOne|TestKernelGemvSmemTiming|TestKernelAbsorbFastTiming)$' > $R/timing.log 2>&1; echo "rc=$?" >> $R/timing.log)
  for f in kernels engine timing; do cnt $f; done
  save ;;
ab)
  for m in deepseek-v3.2 glm-5; do
    bn $m 8192 1 $m-new
    bn $m 8192 1 $m-topk-v1 TILERT_GPU_TOPK_ONE=v1
    bn $m 8192 1 $m-router-old TILERT_GPU_ROUTER_SMEM=0
    bn $m 8192 1 $m-absv-old TILERT_GPU_ABSORB_V_PRE=0
    bn $m 8192 1 $m-all-old $OLD
    bn $m 8192 1 $m-new2
  done ;;
*) echo "usage: s22b.sh check|ab" >&2; exit 2 ;;
esac
