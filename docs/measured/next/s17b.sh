# Session 17's check of the new default fork point (TILERT_GPU_SIDE_Q_AT unset = auto; binaries tilert and
# engine.test of the commit under test in .device/next): the four 1-slot bench rows, then the side-stream test.
set -x
if ls .device/next/*.xz >/dev/null 2>&1; then (cd .device/next && for f in *.xz; do xz -d -f "$f"; done); fi
chmod +x .device/next/* 2>/dev/null
D=$PWD/.device/next; R=/tmp/s17-b; rm -rf $R; mkdir -p $R
export TILERT_KERNEL_CACHE=/tmp/tilert-kernels
save() { tar czf $OUT/s17-b.tgz -C $R .; cp $R/summary.txt $OUT/summary-b.txt 2>/dev/null; }
bn() { local m=$1 c=$2 n=$3; shift 3; env X=1 "$@" timeout 60 $D/tilert bench decode --device cuda --dummy-weights $m --layers 9 --context $c --batches 1 > $R/$n.txt 2>&1; echo "rc=$?" >> $R/$n.txt; grep -A1 "p50 ms" $R/$n.txt | tail -1 | sed "s|^|$n $* |" | tee -a $R/summary.txt; save; }
timeout 100 $D/tilert bench decode --device cuda --dummy-weights glm-5 --layers 1 --context 1024 --batches 1 > $R/warm.txt 2>&1
bn deepseek-v3.2 131072 ds-long
bn glm-5 8192 glm-8k
bn glm-5 131072 glm-long
(cd engine/gpu && timeout 60 $D/engine.test -test.run 'TestGPUSideStreamSameTokens|TestGPUSideCap' -test.v > $R/side.txt 2>&1; echo "rc=$?" >> $R/side.txt)
grep -E "^(--- |ok|FAIL|rc=)" $R/side.txt | tee -a $R/summary.txt; save
bn deepseek-v3.2 8192 ds-8k
