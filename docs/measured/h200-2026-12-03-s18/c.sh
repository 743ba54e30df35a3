# Session 18's call C (issue 10): run 2's GEMV choices as the default (kernels.mmaShape: gemv_mmx `_p` for long fp8
# rows, the paired gate/up and wq_b; the grouped attention inputs of 2..8 rows on gemv_mmx_group_u2) against
# TILERT_GPU_GEMV_MMA=1 (run 1's choices, the group on the tile kernel), with the merged attention epilogue on in both.
# Checks: the group kernel against its CPU reference (u2 and _a), the variants bit for bit, the engine's serving
# checks with every shape on the tensor cores (=all, which now includes the group). Binaries: tilert, kernels.test,
# engine.test in .device/next. ~6 min on a fresh machine.
set -x
if ls .device/next/*.xz >/dev/null 2>&1; then (cd .device/next && for f in *.xz; do xz -d -f "$f"; done); fi
chmod +x .device/next/* 2>/dev/null
D=$PWD/.device/next; R=/tmp/s18c; rm -rf $R; mkdir -p $R
export TILERT_KERNEL_CACHE=/tmp/tilert-kernels
save() { tar czf $OUT/s18c.tgz -C $R .; cp $R/summary.txt $OUT/summary-c.txt 2>/dev/null; }
bn() { local m=$1 c=$2 b=$3 n=$4; shift 4; env X=1 "$@" timeout 100 $D/tilert bench decode --device cuda --dummy-weights $m --layers 9 --context $c --batches $b ${MTP:+--mtp} --json $R/$n.json > $R/$n.txt 2>&1; echo "rc=$?" >> $R/$n.txt; grep -E "^ +[0-9]+ +[0-9]+ +[0-9.]+ " $R/$n.txt | sed "s|^|$n $* |" | tee -a $R/summary.txt; save; }
timeout 120 $D/tilert bench decode --device cuda --dummy-weights glm-5 --layers 1 --context 1024 --batches 1,4 > $R/warm.txt 2>&1
(cd cuda/kernels && timeout 100 $D/kernels.test -test.v -test.count=1 -test.run 'TestKernelGemvGroupMMA|TestKernelMMAVariantsBitwise|TestMMAShape' > $R/check.log 2>&1; echo "rc=$?" >> $R/check.log)
echo "checks: $(grep -c '^--- PASS' $R/check.log) PASS, $(grep -c '^--- FAIL' $R/check.log) FAIL; $(tail -1 $R/check.log)" | tee -a $R/summary.txt; save
for m in default all; do
  (cd engine/gpu && env X=1 $([ $m = all ] && echo TILERT_GPU_GEMV_MMA=all) timeout 120 $D/engine.test -test.v -test.count=1 -test.run '^TestGPU(GreedyMatchesCPU|CachesMatchCPU|LogitsMatchEmulator|ForcedDrafts|GraphsEqualEager|SlotMergeEqualPerSlot|FusedEqualUnfused|SideStreamSameTokens)$' > $R/engine-$m.log 2>&1; echo "rc=$?" >> $R/engine-$m.log)
  echo "engine $m: $(grep -c '^--- PASS' $R/engine-$m.log) PASS, $(grep -c '^--- FAIL' $R/engine-$m.log) FAIL; $(tail -1 $R/engine-$m.log)" | tee -a $R/summary.txt; save
done
bn deepseek-v3.2 8192 4 ds-4
bn deepseek-v3.2 8192 4 ds-4-run1 TILERT_GPU_GEMV_MMA=1
bn glm-5 8192 4 glm-4
bn glm-5 8192 4 glm-4-run1 TILERT_GPU_GEMV_MMA=1
MTP=1 bn deepseek-v3.2 8192 1 ds-mtp
MTP=1 bn deepseek-v3.2 8192 1 ds-mtp-run1 TILERT_GPU_GEMV_MMA=1
bn deepseek-v3.2 131072 4 ds-4-long
