# Next session, after run.sh (NOT RUN; ~300 s): opt-in switches under session 11's defaults (programmatic launches,
# side streams, side GEMVs capped), one bench each (DeepSeek-V3.2 dims, 9 MoE layers, 8192, 1 slot, p50), then the
# engine checks with TILERT_GPU_PDL_MORE=1. Session 11's call F (cut by the budget) had: base 2.772 ms, FUSE=3 2.773,
# TOPK_FAST=2 2.792, SIDE_CAP=2 2.842, GROUP=3 2.769: none better. Its base and NORM_FUSE=1 runs were lost to a
# 45 s timeout on a cold NVRTC cache: the first bench here gets 120 s.
# TILERT_GPU_PDL_MORE=1 (cuda/kernels pdl.go pdlMoreKernels): the MLA decode (tcf2 / few), the absorbs, topk_fast and
# the mid GEMVs launch programmatically too (~4 plain launches a layer today in a programmatic chain). Prediction:
# -1 us each, ~-40 us a step; if slower, the early-resident blocks take SM room from the q_b stream beside them.
# TILERT_GPU_SIDE_MOE=route (forward.go routeBeside): the MoE fork turned round, the router + routing on the side
# stream and the shared expert on the main one at its full grid. Session 11's call E charged the router and the
# routing ~10 us a layer each with the capped shared expert beside them; prediction -5..-10 us a layer. SIDE=q
# alone tells what the MoE fork is worth today. The engine checks below run with both switches.
set -x
cd .device/next && for f in *.xz; do xz -d -f "$f"; done; chmod +x *; cd ../..
D=$PWD/.device/next
R=/tmp/sweep; rm -rf $R; mkdir -p $R
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
tar czf $OUT/sweep.tgz -C $R .
