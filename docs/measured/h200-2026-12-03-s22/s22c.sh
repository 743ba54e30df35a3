# Session 22, call C (issue 10): the indexer query's preparation inside the scores kernel (helper epiq) with the
# faster one-block top-k (helper topk1), against the old arrangement and q_b's cap / fork point (NOT RUN when
# written). Binaries of main (tilert, kernels.test, engine.test) in .device/next, xz'd or not.
# Usage: bash docs/measured/next/s22c.sh ab|check
#  ab (~5 min): the step at 8192, 1 slot: DeepSeek-V3.2 dims new (top-k w + attn_epilogue_norm + scores with the q
#     prologue) with q_b's side cap 1 (default), 2, 0 and the late fork; TILERT_GPU_IDX_QPRO=0; both old; new again;
#     GLM-5 dims new / qpro 0 / both old / new; then one traced step of the new default.
#  check (~3 min): the new kernels' checks and the engine's GPU checks of the step (both models), graph timings.
set -x
if ls .device/next/*.xz >/dev/null 2>&1; then (cd .device/next && for f in *.xz; do xz -d -f "$f"; done); fi
chmod +x .device/next/* 2>/dev/null
D=$PWD/.device/next
P=$1; R=/tmp/s22c-$P; rm -rf $R; mkdir -p $R
export TILERT_KERNEL_CACHE=/tmp/tilert-kernels
save() { tar czf $OUT/s22c-$P.tgz -C $R .; cp $R/summary.txt $OUT/summary-c-$P.txt 2>/dev/null; }
bn() { local m=$1 c=$2 b=$3 n=$4; shift 4; env X=1 "$@" timeout 120 $D/tilert bench decode --device cuda --dummy-weights $m --layers 9 --context $c --batches $b ${TL:+--timeline $R/$n.json} > $R/$n.txt 2>&1; echo "rc=$?" >> $R/$n.txt; grep -E "^ +[0-9]+ +[0-9]+ +[0-9.]+ " $R/$n.txt | sed "s|^|$n $* |" | tee -a $R/summary.txt; grep -m2 "error" $R/$n.txt >> $R/summary.txt; save; }
cnt() { echo "$1: $(grep -c -- '--- PASS' $R/$1.log) PASS, $(grep -c -- '--- FAIL' $R/$1.log) FAIL, $(grep -c -- '--- SKIP' $R/$1.log) SKIP; $(tail -1 $R/$1.log)" | tee -a $R/summary.txt; grep -E -- '--- FAIL' -A8 $R/$1.log | head -40 >> $R/summary.txt; }
OLD="TILERT_GPU_TOPK_ONE=v1 TILERT_GPU_IDX_QPRO=0"
case "$P" in
ab)
  timeout 120 $D/tilert bench decode --device cuda --dummy-weights glm-5 --layers 1 --context 1024 --batches 1 > $R/warm.txt 2>&1
  bn deepseek-v3.2 8192 1 ds-new
  bn deepseek-v3.2 8192 1 ds-new-cap2 TILERT_GPU_SIDE_CAP=q=2
  bn deepseek-v3.2 8192 1 ds-new-cap0 TILERT_GPU_SIDE_CAP=q=0
  bn deepseek-v3.2 8192 1 ds-new-late TILERT_GPU_SIDE_Q_AT=topk-all
  bn deepseek-v3.2 8192 1 ds-qpro0 TILERT_GPU_IDX_QPRO=0
  bn deepseek-v3.2 8192 1 ds-old $OLD
  bn deepseek-v3.2 8192 1 ds-new2
  bn glm-5 8192 1 glm-new
  bn glm-5 8192 1 glm-qpro0 TILERT_GPU_IDX_QPRO=0
  bn glm-5 8192 1 glm-old $OLD
  bn glm-5 8192 1 glm-new2
  TL=1 bn deepseek-v3.2 8192 1 tl-ds-new
  xz -T4 $R/*.json 2>/dev/null; save ;;
check)
  (cd cuda/kernels && timeout 170 $D/kernels.test -test.v -test.count=1 -test.timeout=3m -test.run '^(TestKernelIndexerQPro|TestKernelIndexer|TestKernelFusedAttnEpilogue.*|TestPDLKernelsWait|TestKernelTopKOneW)$' > $R/kernels.log 2>&1; echo "rc=$?" >> $R/kernels.log
   TILERT_GPU_TIMING=1 timeout 60 $D/kernels.test -test.v -test.count=1 -test.timeout=1m -test.run '^TestKernelIndexerQProTiming$' > $R/timing.log 2>&1; echo "rc=$?" >> $R/timing.log) &
  (cd engine/gpu && timeout 230 $D/engine.test -test.v -test.count=1 -test.timeout=4m -test.run '^(TestGPUIdxQProEqualOld|TestGPUGreedyMatchesCPU|TestGPUGreedyMatchesCPUBF16|TestGPUCachesMatchCPU|TestGPUFusedEqualUnfused|TestGPUSideStreamSameTokens|TestGPUSlotMergeEqualPerSlot|TestGPUGemvMidProjections|TestGPUGraphsEqualEager|TestGPUGolden|TestGPUMLADecodeWG|TestGPUPipelineMatches)$' > $R/engine.log 2>&1; echo "rc=$?" >> $R/engine.log) &
  wait
  for f in kernels engine timing; do cnt $f; done
  grep -E "timing_test.go" $R/timing.log | cut -c1-220 >> $R/summary.txt
  save ;;
*) echo "usage: s22c.sh ab|check" >&2; exit 2 ;;
esac
