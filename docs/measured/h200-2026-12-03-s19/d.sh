# Session 19's fourth call (issue 10): gpu-check's engine part with mla_decode_wg2 as the default decode MLA (128
# heads, or 64 from 2 rows; TILERT_GPU_MLA_WG unset). Binaries of the working tree in .device/next.
# Usage: bash docs/measured/next/s19d.sh
set -x
if ls .device/next/*.xz >/dev/null 2>&1; then (cd .device/next && for f in *.xz; do xz -d -f "$f"; done); fi
chmod +x .device/next/* 2>/dev/null
D=$PWD/.device/next
R=/tmp/s19d; rm -rf $R; mkdir -p $R
export TILERT_KERNEL_CACHE=/tmp/tilert-kernels
save() { tar czf $OUT/s19d.tgz -C $R .; cp $R/summary.txt $OUT/summary-s19d.txt 2>/dev/null; }
(cd engine/gpu && timeout 330 $D/engine.test -test.v -test.count=1 -test.run '^TestGPU' > $R/engine.log 2>&1; echo "rc=$?" >> $R/engine.log)
for f in engine; do echo "$f: $(grep -c '^--- PASS' $R/$f.log) PASS, $(grep -c '^--- FAIL' $R/$f.log) FAIL, $(grep -c '^--- SKIP' $R/$f.log) SKIP; $(tail -1 $R/$f.log)" | tee -a $R/summary.txt; done
grep -E "^--- FAIL|mla_decode_wg2" $R/engine.log | head -20 >> $R/summary.txt; save
