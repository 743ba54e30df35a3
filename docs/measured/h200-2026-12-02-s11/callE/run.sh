# Session 11 call E: the issue-10 tables with this session's defaults (one command each), 4 slots against the
# old defaults, a profile, and the TP-8 shard timing.
set -x
cd .device/next && for f in *.xz; do xz -d -f "$f"; done; chmod +x *; cd ../..
D=$PWD/.device/next
R=/tmp/s11e; rm -rf $R; mkdir -p $R
export TILERT_KERNEL_CACHE=/tmp/tilert-kernels
bn() { local n=$1; shift; env "$@" timeout 100 $D/tilert bench decode --device cuda --json $R/$n.json "${BARGS[@]}" > $R/$n.txt 2>&1; echo "rc=$?" >> $R/$n.txt; grep -A9 "p50 ms" $R/$n.txt | grep -E "^ +[0-9]" | sed "s/^/$n /" >> $R/summary.txt; }
BARGS=(--dummy-weights deepseek-v3.2 --layers 9 --context 8192,131072 --batches 1,4); bn ds
BARGS=(--dummy-weights glm-5 --layers 9 --context 8192,131072 --batches 1,4); bn glm
BARGS=(--dummy-weights deepseek-v3.2 --layers 9 --context 8192 --batches 1,4); bn ds-old TILERT_GPU_SIDE=0 TILERT_GPU_PDL=0
BARGS=(--dummy-weights deepseek-v3.2 --layers 9 --context 8192 --batches 4); bn ds4-noside TILERT_GPU_SIDE=0
BARGS=(--dummy-weights deepseek-v3.2 --layers 9 --context 8192 --batches 4); bn ds4-nocap TILERT_GPU_SIDE_CAP=0
cp $R/summary.txt $OUT/summary.txt; cat $R/summary.txt
BARGS=(--dummy-weights deepseek-v3.2 --layers 9 --context 8192 --batches 1 --profile); bn ds-profile
tail -27 $R/ds-profile.txt
(cd engine/gpu && TILERT_GPU_TIMING=1 timeout 120 $D/engine.test -test.run 'TestGPUShardLayerTiming$' -test.v > $R/shard.log 2>&1; echo "rc=$?" >> $R/shard.log)
grep -E "graphed|PASS|FAIL|rc=" $R/shard.log | cut -c1-200
tar czf $OUT/e.tgz -C $R .
