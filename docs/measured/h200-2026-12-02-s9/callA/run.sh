# Session 9, call A: helper pdlw's fragment (TILERT_GPU_PDL=2), helper gbulk's (TILERT_GPU_GEMV_BULK=1), both
# together, and main's default profile at 8192 (the baseline the session's new work is aimed by).
set -x
cd .device/next && gunzip -f *.gz; chmod +x *; cd ../..
D=$PWD/.device/next
R=/tmp/s9a; rm -rf $R; mkdir -p $R
export TILERT_KERNEL_CACHE=/tmp/tilert-kernels
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv > $R/smi.txt 2>&1
source docs/measured/next5/pdlw.sh
tar czf $OUT/a1.tgz -C $R .
source docs/measured/next5/gbulk.sh
tar czf $OUT/a2.tgz -C $R .
env TILERT_GPU_PDL=2 TILERT_GPU_GEMV_BULK=1 timeout 30 $D/tilert bench decode --device cuda --dummy-weights deepseek-v3.2 --layers 9 \
  --context 8192 --batches 1,4 --json $R/bench-both.json > $R/bench-both.txt 2>&1; echo rc=$? >> $R/bench-both.txt
timeout 40 $D/tilert bench decode --device cuda --dummy-weights deepseek-v3.2 --layers 9 \
  --context 8192 --batches 1 --profile --json $R/bench-profile.json > $R/bench-profile.txt 2>&1; echo rc=$? >> $R/bench-profile.txt
tar czf $OUT/a3.tgz -C $R .
grep -h "8192 " $R/pdlw/bench-*.txt $R/gbulk/bench-*.txt $R/bench-both.txt
grep -h rc= $R/*/*.log $R/*/*.txt $R/*.txt
grep -hc FAIL $R/*/*report.txt
