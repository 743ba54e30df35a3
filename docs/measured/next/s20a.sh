# Session 20, call A (issue 10): where mla_decode_wg2's 16 us at one row go (ncu: full set + the SASS source page
# with stall samples), the GEMV checks with session 19's fixed pinning, and today's 1-slot steps at 131072 / 8192.
# Binaries of main (tilert, kernels.test) in .device/next, xz'd or not. Usage: bash s20a.sh
set -x
if ls .device/next/*.xz >/dev/null 2>&1; then (cd .device/next && for f in *.xz; do xz -d -f "$f"; done); fi
chmod +x .device/next/* 2>/dev/null
D=$PWD/.device/next; R=/tmp/s20a; rm -rf $R; mkdir -p $R
export TILERT_KERNEL_CACHE=/tmp/tilert-kernels
save() { tar czf $OUT/s20a.tgz -C $R .; cp $R/summary.txt $OUT/summary.txt 2>/dev/null; }
bn() { local m=$1 c=$2 b=$3 n=$4; shift 4; env X=1 "$@" timeout 120 $D/tilert bench decode --device cuda --dummy-weights $m --layers 9 --context $c --batches $b > $R/$n.txt 2>&1; echo "rc=$?" >> $R/$n.txt; grep -E "^ +[0-9]+ +[0-9]+ +[0-9.]+ " $R/$n.txt | sed "s|^|$n $* |" | tee -a $R/summary.txt; save; }
timeout 120 $D/tilert bench decode --device cuda --dummy-weights glm-5 --layers 1 --context 1024 --batches 1 > $R/warm.txt 2>&1
NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
(cd cuda/kernels && TILERT_GPU_PROFILE_MLA=1 timeout 240 $NCU --clock-control none --set full --import-source no \
  -k regex:'mla_decode_wg2|mla_combine_wide$' -o $R/mla $D/kernels.test -test.run 'TestKernelProfileMLA' -test.v > $R/ncu-run.txt 2>&1; echo rc=$? >> $R/ncu-run.txt)
$NCU -i $R/mla.ncu-rep --page details > $R/ncu-details.txt 2>&1
$NCU -i $R/mla.ncu-rep --page source --csv --print-source sass -k regex:mla_decode_wg2 > $R/ncu-source-wg2.csv 2>&1
$NCU -i $R/mla.ncu-rep --page source --csv --print-source sass -k regex:mla_combine > $R/ncu-source-combine.csv 2>&1
ls -la $R >> $R/summary.txt; save
(cd cuda/kernels && timeout 200 $D/kernels.test -test.run 'TestKernelGemvMMA$|TestKernelGemvGroupMMA$|TestKernelMMAVariantsBitwise$' -test.v -test.count=1 > $R/gemv.log 2>&1; echo "rc=$?" >> $R/gemv.log)
echo "gemv checks: $(grep -c '^--- PASS' $R/gemv.log) PASS, $(grep -c '^--- FAIL' $R/gemv.log) FAIL; $(tail -1 $R/gemv.log)" | tee -a $R/summary.txt; save
bn deepseek-v3.2 131072 1 ds-long
bn glm-5 131072 1 glm-long
bn deepseek-v3.2 8192 1 ds-8k
bn glm-5 8192 1 glm-8k
