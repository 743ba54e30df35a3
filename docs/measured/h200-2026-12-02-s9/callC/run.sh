# Session 9, call C: the three helpers' fragments (sattn, gmid, pmoe) on the merged integration branch s9int, then
# every switch whose kernel checks passed, together.
set -x
cd .device/next && gunzip -f *.gz; chmod +x *; cd ../..
D=$PWD/.device/next
R=/tmp/s9c; rm -rf $R; mkdir -p $R
export TILERT_KERNEL_CACHE=/tmp/tilert-kernels
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv > $R/smi.txt 2>&1
# 0. main's default (compiles the default module if the cache misses), with the per-call profile
timeout 120 $D/tilert bench decode --device cuda --dummy-weights deepseek-v3.2 --layers 9 --context 8192 --batches 1 --profile \
  --json $R/base.json > $R/base.txt 2>&1; echo rc=$? >> $R/base.txt
tar czf $OUT/c0.tgz -C $R .
source docs/measured/next6/sattn.sh; tar czf $OUT/c1.tgz -C $R .
source docs/measured/next6/gmid.sh; tar czf $OUT/c2.tgz -C $R .
source docs/measured/next6/pmoe.sh; tar czf $OUT/c3.tgz -C $R .   # pmoe.sh now beside this file (moved in session 11, when moe_persist was removed)
ALL=""
grep -q '^rc=0$' $R/sattn/kernels.log && ALL="$ALL TILERT_GPU_MLA_FEW=1 TILERT_GPU_TOPK_FAST=2"
grep -q '^rc=0$' $R/gmid/kernels.log && ALL="$ALL TILERT_GPU_GEMV_MID=1"
grep -q '^pm_ok=1$' $R/pmoe/kernels.log && grep -q '^rc=0$' $R/pmoe/kernels.log && ALL="$ALL TILERT_GPU_MOE_PERSIST=1"
echo "ALL=$ALL" > $R/all.txt
env $ALL timeout 45 $D/tilert bench decode --device cuda --dummy-weights deepseek-v3.2 --layers 9 --context 8192,131072 --batches 1 --profile \
  --json $R/all.json >> $R/all.txt 2>&1; echo rc=$? >> $R/all.txt
(cd engine/gpu && env $ALL TILERT_GPU_TIMING=1 timeout 20 $D/engine.test -test.count=1 -test.v -test.run 'TestGPUShardLayerTiming$' > $R/all-shard.log 2>&1; echo rc=$? >> $R/all-shard.log)
tar czf $OUT/c4.tgz -C $R .
grep -h " 8192 \| 131072 " $R/*.txt $R/*/bench-*.txt
grep -h rc= $R/*/*.log $R/*.txt $R/*.log | sort | uniq -c
grep -l FAIL $R/*/*report*.txt; cat $R/all.txt | head -3
