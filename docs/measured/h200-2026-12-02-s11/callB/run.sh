# Session 11 call B: can the latency-bound chains overlap the weight streams? Side streams (TILERT_GPU_SIDE=1: q_b +
# absorbQ beside the indexer's wq_b/scores/top-k, now also over gemv_mid's grouped q_b; the shared expert beside the
# router and the routing) with the main chain at the greatest launch priority (TILERT_GPU_SIDE_PRIO=1) and the side
# GEMVs capped at 1 block per SM (TILERT_GPU_SIDE_CAP=1). Call A's in-graph costs a layer: q_b+wq_b 18.4 us,
# indexer scores+top-k 18.0, absorbQ 6.2, router 2.8 + route 4.7 against the shared expert's ~11.
# Prediction: SIDE=1+PRIO+CAP saves 10-20 us a layer (2.92 -> ~2.75-2.82 ms); SIDE=1 alone ~-20 us a step (session 7).
set -x
cd .device/next && for f in *.xz; do xz -d -f "$f"; done; chmod +x *; cd ../..
D=$PWD/.device/next
R=$OUT
export TILERT_KERNEL_CACHE=/tmp/tilert-kernels
b() { # name, env...
  local n=$1; shift
  env "$@" timeout 60 $D/tilert bench decode --device cuda --dummy-weights deepseek-v3.2 --layers 9 --context 8192 --batches 1 --json $R/$n.json > $R/$n.txt 2>&1; echo "rc=$?" >> $R/$n.txt
  grep -A1 "p50 ms" $R/$n.txt | tail -1 | sed "s/^/$n /" >> $R/summary.txt
}
b unset
b side TILERT_GPU_SIDE=1
b side-prio TILERT_GPU_SIDE=1 TILERT_GPU_SIDE_PRIO=1
b side-cap TILERT_GPU_SIDE=1 TILERT_GPU_SIDE_CAP=1
b side-prio-cap TILERT_GPU_SIDE=1 TILERT_GPU_SIDE_PRIO=1 TILERT_GPU_SIDE_CAP=1
b q-prio-cap TILERT_GPU_SIDE=q TILERT_GPU_SIDE_PRIO=1 TILERT_GPU_SIDE_CAP=1
b moe-prio-cap TILERT_GPU_SIDE=moe TILERT_GPU_SIDE_PRIO=1 TILERT_GPU_SIDE_CAP=1
b unset2
cat $R/summary.txt
TILERT_GPU_SIDE=1 TILERT_GPU_SIDE_PRIO=1 TILERT_GPU_SIDE_CAP=1 timeout 90 $D/tilert bench decode --device cuda --dummy-weights deepseek-v3.2 --layers 9 --context 8192 --batches 1 --profile > $R/side-prio-cap-profile.txt 2>&1
tail -28 $R/side-prio-cap-profile.txt
(cd engine/gpu && timeout 120 $D/engine.test -test.run 'TestGPUSideStreamSameTokens' -test.v > $R/side-test.log 2>&1; echo "rc=$?" >> $R/side-test.log)
grep -E "^(---|ok|FAIL|PASS)|forks" $R/side-test.log | tail -12
