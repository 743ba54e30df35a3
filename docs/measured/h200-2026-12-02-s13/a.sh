# Session 13 call A: session 12's sweep (docs/measured/next/sweep.sh) plus a profile at 131072.
# Build and carry as docs/measured/next/run.sh says. Session 12 (docs/measured/h200-2026-12-02-s12) found that a
# programmatic launch on the side stream can cost more than it saves: absorb_q launched so behind the capped q_b cost
# 150 us a step, its grid resident in griddepcontrol.wait and holding the SM room the indexer chain needed.
# TILERT_GPU_SIDE_PDL=0 (engine/gpu side.go; kernels.Set.SetPlain between fork and unfork) launches every side-stream
# kernel plainly. The one it changes in today's step is the shared expert's down GEMV (capped, programmatic behind
# its gate/up): its waiting blocks would hold the other half of every SM's registers for the whole gate/up, leaving
# the router and the routing on the main stream no room. Prediction: router + routing in-graph ~22.5 -> ~10 us a
# layer (they take ~3-4 us each alone), the step -60..-100 us at 8192, 1 slot (2.74 -> ~2.66 ms); if no change, the
# theory is wrong for this fork (the shared gate/up alone may fill the SMs' other resource, shared memory or warps).
set -x
cd .device/next && for f in *.xz; do xz -d -f "$f"; done; chmod +x *; cd ../..
D=$PWD/.device/next
R=/tmp/sweep; rm -rf $R; mkdir -p $R
export TILERT_KERNEL_CACHE=/tmp/tilert-kernels
bn() { local m=$1 n=$2 t=$3; shift 3; env "$@" timeout $t $D/tilert bench decode --device cuda --dummy-weights $m --layers 9 --context 8192 --batches 1 --json $R/$n.json > $R/$n.txt 2>&1; echo "rc=$?" >> $R/$n.txt; grep -A1 "p50 ms" $R/$n.txt | tail -1 | sed "s/^/$n $* /" >> $R/summary.txt; cp $R/summary.txt $OUT/summary.txt; }
bn deepseek-v3.2 base 120
bn deepseek-v3.2 sideplain 45 TILERT_GPU_SIDE_PDL=0
bn deepseek-v3.2 sideplain-cap0 45 TILERT_GPU_SIDE_PDL=0 TILERT_GPU_SIDE_CAP=0
bn deepseek-v3.2 sideplain-cap2 45 TILERT_GPU_SIDE_PDL=0 TILERT_GPU_SIDE_CAP=2
bn deepseek-v3.2 base2 45
bn deepseek-v3.2 sideplain2 45 TILERT_GPU_SIDE_PDL=0
bn glm-5 glm-base 60
bn glm-5 glm-sideplain 45 TILERT_GPU_SIDE_PDL=0
(TILERT_GPU_SIDE_PDL=0 timeout 150 $D/tilert bench decode --device cuda --dummy-weights deepseek-v3.2 --layers 9 --context 8192 --batches 1 --profile > $R/profile-sideplain.txt 2>&1)
(cd engine/gpu && timeout 120 $D/engine.test -test.run 'TestGPUSideStreamSameTokens|TestGPUSideCapScoped' -test.v > $R/engine-side.log 2>&1; echo "rc=$?" >> $R/engine-side.log)
grep -E "^--- (PASS|FAIL)|^rc=" $R/engine-side.log | tail -6
tar czf $OUT/sweep.tgz -C $R .
# The long-context step's critical path (defaults): where the 131072-token step's extra time goes.
(timeout 150 $D/tilert bench decode --device cuda --dummy-weights deepseek-v3.2 --layers 9 --context 131072 --batches 1 --profile > $R/profile-131072.txt 2>&1)
tar czf $OUT/sweep.tgz -C $R .
