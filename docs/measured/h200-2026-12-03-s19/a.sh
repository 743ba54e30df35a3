# Session 18's plan for the next device session (issue 10; NOT RUN). Binaries of main (tilert, kernels.test,
# engine.test; the build line in docs/measured/next/README.md), xz'd or not, in .device/next. Ask `status` first.
# Usage: bash docs/measured/next/s19.sh check|steps
#  check (~7 min cold): gpu-check's engine part with session 18's defaults at several rows (the merged epilogue,
#        run 2's GEMVs, the group on the tensor cores from 3 rows); the kernel checks of those kernels, including the
#        `_p` shapes added after session 18's calls (r1 u1, r4 u1, r2 u2; gemv_mmx_group_p, forceMMAP 1), and their
#        graph-timed sweep (TestKernelMMATiming): a faster `_p` shape or the group on `_p` goes into mmaShape /
#        GemvGroupMMA where it wins at M = 4 and 8.
#  steps (~4 min): the MTP step with the group from 3 rows (not timed in session 18), the 4-slot in-graph profile
#        of the new defaults (both models, 8192), and the late q fork at 4 slots (s18.sh rows).
set -x
if ls .device/next/*.xz >/dev/null 2>&1; then (cd .device/next && for f in *.xz; do xz -d -f "$f"; done); fi
chmod +x .device/next/* 2>/dev/null
D=$PWD/.device/next
P=$1; R=/tmp/s19-$P; rm -rf $R; mkdir -p $R
export TILERT_KERNEL_CACHE=/tmp/tilert-kernels
save() { tar czf $OUT/s19-$P.tgz -C $R .; cp $R/summary.txt $OUT/summary-$P.txt 2>/dev/null; }
bn() { local m=$1 c=$2 b=$3 n=$4; shift 4; env X=1 "$@" timeout 100 $D/tilert bench decode --device cuda --dummy-weights $m --layers 9 --context $c --batches $b ${MTP:+--mtp} ${PROF:+--profile} > $R/$n.txt 2>&1; echo "rc=$?" >> $R/$n.txt; grep -E "^ +[0-9]+ +[0-9]+ +[0-9.]+ " $R/$n.txt | sed "s|^|$n $* |" | tee -a $R/summary.txt; save; }
timeout 120 $D/tilert bench decode --device cuda --dummy-weights glm-5 --layers 1 --context 1024 --batches 1,4 > $R/warm.txt 2>&1
case "$P" in
check)
  (cd cuda/kernels && timeout 200 $D/kernels.test -test.v -test.count=1 -test.run 'TestKernelGemvMMA$|TestKernelGemvGroupMMA|TestKernelMMAVariantsBitwise|TestKernelFusedAttnEpilogue' > $R/kernels.log 2>&1; echo "rc=$?" >> $R/kernels.log)
  (cd engine/gpu && timeout 300 $D/engine.test -test.v -test.count=1 -test.run '^TestGPU' > $R/engine.log 2>&1; echo "rc=$?" >> $R/engine.log)
  (cd cuda/kernels && TILERT_GPU_TIMING=1 timeout 120 $D/kernels.test -test.v -test.count=1 -test.run 'TestKernelMMATiming' > $R/timing.log 2>&1; echo "rc=$?" >> $R/timing.log)
  grep "mma sweep\|attn-in group" $R/timing.log | cut -c1-900 >> $R/summary.txt
  for f in kernels engine; do echo "$f: $(grep -c '^--- PASS' $R/$f.log) PASS, $(grep -c '^--- FAIL' $R/$f.log) FAIL, $(grep -c '^--- SKIP' $R/$f.log) SKIP; $(tail -1 $R/$f.log)" | tee -a $R/summary.txt; done; save ;;
steps)
  MTP=1 bn deepseek-v3.2 8192 1 ds-mtp
  MTP=1 bn deepseek-v3.2 8192 1 ds-mtp-run1 TILERT_GPU_GEMV_MMA=1
  PROF=1 bn deepseek-v3.2 8192 4 ds-4-prof
  PROF=1 bn glm-5 8192 4 glm-4-prof
  bn deepseek-v3.2 131072 4 ds-4-long-topk TILERT_GPU_SIDE_Q_AT=topk
  bn deepseek-v3.2 131072 4 ds-4-long ;;
*) echo "usage: s19.sh check|steps" >&2; exit 2 ;;
esac
