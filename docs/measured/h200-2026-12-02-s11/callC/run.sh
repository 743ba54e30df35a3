# Session 11 call C: call B's profile of SIDE=1+PRIO+CAP timed its graphs at 2919 us plain but 2762 us with
# programmatic launches (TILERT_GPU_PDL=1; without side streams PDL gives 2888 against 2905). The bench with PDL=1
# for each side configuration, the side test with PDL=1, and a profile of the best guess.
set -x
cd .device/next && for f in *.xz; do xz -d -f "$f"; done; chmod +x *; cd ../..
D=$PWD/.device/next
R=/tmp/s11c; rm -rf $R; mkdir -p $R
export TILERT_KERNEL_CACHE=/tmp/tilert-kernels
b() { # name, env...
  local n=$1; shift
  env "$@" timeout 60 $D/tilert bench decode --device cuda --dummy-weights deepseek-v3.2 --layers 9 --context 8192 --batches 1 --json $R/$n.json > $R/$n.txt 2>&1; echo "rc=$?" >> $R/$n.txt
  grep -A1 "p50 ms" $R/$n.txt | tail -1 | sed "s/^/$n /" >> $R/summary.txt
}
b unset
b pdl TILERT_GPU_PDL=1
b pdl-side TILERT_GPU_PDL=1 TILERT_GPU_SIDE=1
b pdl-side-prio TILERT_GPU_PDL=1 TILERT_GPU_SIDE=1 TILERT_GPU_SIDE_PRIO=1
b pdl-side-prio-cap TILERT_GPU_PDL=1 TILERT_GPU_SIDE=1 TILERT_GPU_SIDE_PRIO=1 TILERT_GPU_SIDE_CAP=1
b pdl-side-cap TILERT_GPU_PDL=1 TILERT_GPU_SIDE=1 TILERT_GPU_SIDE_CAP=1
b pdl-q-prio TILERT_GPU_PDL=1 TILERT_GPU_SIDE=q TILERT_GPU_SIDE_PRIO=1
b pdl-moe-prio TILERT_GPU_PDL=1 TILERT_GPU_SIDE=moe TILERT_GPU_SIDE_PRIO=1
b side-prio TILERT_GPU_SIDE=1 TILERT_GPU_SIDE_PRIO=1
cp $R/summary.txt $OUT/summary.txt
cat $R/summary.txt
TILERT_GPU_PDL=1 TILERT_GPU_SIDE=1 TILERT_GPU_SIDE_PRIO=1 timeout 90 $D/tilert bench decode --device cuda --dummy-weights deepseek-v3.2 --layers 9 --context 8192 --batches 1 --profile > $R/pdl-side-prio-profile.txt 2>&1
tail -28 $R/pdl-side-prio-profile.txt
(cd engine/gpu && TILERT_GPU_PDL=1 timeout 120 $D/engine.test -test.run 'TestGPUSideStreamSameTokens' -test.v > $R/side-test-pdl.log 2>&1; echo "rc=$?" >> $R/side-test-pdl.log)
grep -E "^(---|ok|FAIL|PASS)|forks|rc=" $R/side-test-pdl.log | tail -6
tar czf $OUT/c.tgz -C $R .
