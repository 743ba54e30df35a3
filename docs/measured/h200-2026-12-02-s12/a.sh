# Session 12 call A: docs/measured/next/sweep.sh (opt-in switches under session 11 defaults) + a --profile run with the defaults.
set -x
cd .device/next && for f in *.xz; do xz -d -f "$f"; done; chmod +x *; cd ../..
D=$PWD/.device/next
R=/tmp/s12a; rm -rf $R; mkdir -p $R
export TILERT_KERNEL_CACHE=/tmp/tilert-kernels
bn() { local m=$1 n=$2 t=$3; shift 3; env "$@" timeout $t $D/tilert bench decode --device cuda --dummy-weights $m --layers 9 --context 8192 --batches 1 --json $R/$n.json > $R/$n.txt 2>&1; echo "rc=$?" >> $R/$n.txt; grep -A1 "p50 ms" $R/$n.txt | tail -1 | sed "s/^/$n $* /" >> $R/summary.txt; cp $R/summary.txt $OUT/summary.txt; }
bn deepseek-v3.2 base 120
bn deepseek-v3.2 pdlmore 45 TILERT_GPU_PDL_MORE=1
bn deepseek-v3.2 normfuse1 45 TILERT_GPU_NORM_FUSE=1
bn deepseek-v3.2 moeroute 45 TILERT_GPU_SIDE_MOE=route
bn deepseek-v3.2 sideq 45 TILERT_GPU_SIDE=q
bn deepseek-v3.2 moeroute-pdlmore 45 TILERT_GPU_SIDE_MOE=route TILERT_GPU_PDL_MORE=1
bn deepseek-v3.2 base2 45
bn deepseek-v3.2 pdlmore2 45 TILERT_GPU_PDL_MORE=1
bn glm-5 glm-base 60
bn glm-5 glm-pdlmore 45 TILERT_GPU_PDL_MORE=1
bn glm-5 glm-moeroute 45 TILERT_GPU_SIDE_MOE=route
(cd engine/gpu && TILERT_GPU_PDL_MORE=1 TILERT_GPU_SIDE_MOE=route timeout 150 $D/engine.test -test.run 'TestGPUGreedyMatchesCPU|TestGPUGraphsEqualEager|TestGPUSideStreamSameTokens|TestGPUAbsorbFast|TestGPUFewKernels|TestGPUShardGreedy' -test.v > $R/engine-pdlmore.log 2>&1; echo "rc=$?" >> $R/engine-pdlmore.log)
grep -E "^--- (PASS|FAIL)|^rc=" $R/engine-pdlmore.log | tail -12
(cd engine/gpu && TILERT_GPU_PDL_MORE=1 TILERT_GPU_TIMING=1 timeout 60 $D/engine.test -test.run 'TestGPUShardLayerTiming$' -test.v > $R/shard-pdlmore.log 2>&1)
grep -E "graphed" $R/shard-pdlmore.log | cut -c1-200
timeout 150 $D/tilert bench decode --device cuda --dummy-weights deepseek-v3.2 --layers 9 --context 8192 --batches 1 --profile > $R/profile.txt 2>&1; echo "rc=$?" >> $R/profile.txt
tar czf $OUT/a.tgz -C $R .
