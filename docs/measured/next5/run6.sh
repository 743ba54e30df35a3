# Ran as session 9 call A (the outcome: cuda/kernels/NOTES.md "PDL mode 2 (pdlw)"). Kept as the record of what
# ran: TILERT_GPU_PDL=2 and TestKernelPDLEarlyChain were removed afterwards, so it no longer runs on main.
# Session 8, call 6 (the last ~225 s of device time, a cold start included): helper pdlw's TILERT_GPU_PDL=2 (GEMV
# weight loads issued before griddepcontrol.wait, early triggers), trimmed from docs/measured/next5/pdlw.sh: the
# chain check (default module + plain launches against the early module + programmatic launches, eager and
# graphed, bit for bit), then the decode bench unset and with =2. Build: kernels.test, engine.test, tilert.
set -x
cd .device/next && gunzip -f *.gz; chmod +x *; cd ../..
D=$PWD/.device/next
R=/tmp/next6; rm -rf $R; mkdir -p $R/pdlw
export TILERT_KERNEL_CACHE=/tmp/tilert-kernels
(cd cuda/kernels && unset TILERT_GPU_PDL && TILERT_GPU_REPORT=$R/pdlw/kernels-report.txt timeout 75 $D/kernels.test \
  -test.count=1 -test.v -test.run 'TestKernelPDLEarlyChain$' > $R/pdlw/kernels.log 2>&1; echo rc=$? >> $R/pdlw/kernels.log)
tar czf $OUT/s1.tgz -C $R .
for m in unset 2; do
  if [ $m = unset ]; then e="env -u TILERT_GPU_PDL"; else e="env TILERT_GPU_PDL=$m"; fi
  $e timeout 28 $D/tilert bench decode --device cuda --dummy-weights deepseek-v3.2 --layers 9 --context 8192 --batches 1 \
    --json $R/pdlw/bench-pdl-$m.json > $R/pdlw/bench-pdl-$m.txt 2>&1; echo rc=$? >> $R/pdlw/bench-pdl-$m.txt
  tar czf $OUT/s2.tgz -C $R .
done
grep -h "8192" $R/pdlw/bench-pdl-*.txt; grep -c PASS $R/pdlw/kernels-report.txt; grep -c FAIL $R/pdlw/kernels-report.txt
