# Session 4: the helpers' session-3 round-2 plans, all from merged main's binaries (.device/final, built as
# run.sh says). Usage: bash docs/measured/h200-2026-12-01-s4-round2/round2.sh NAME... (attn mlapf pfill mrows fuse async); each
# helper's results go to $OUT/NAME, each under its own time limit.
cd .device/final && gunzip -f *.gz 2>/dev/null; chmod +x *; cd ../..
export TILERT_KERNEL_CACHE=/tmp/tilert-kernels
D=$PWD/.device/final
mlapf() {
  set -x
  (cd cuda/kernels && TILERT_GPU_REPORT=$RES/kcheck-report.txt timeout 60 $D/kernels.test -test.v -test.count=1 -test.run 'TestKernelMLAPrefill$' > $RES/kcheck.log 2>&1; echo rc=$? >> $RES/kcheck.log)
  (cd cuda/kernels && TILERT_GPU_TIMING=1 timeout 30 $D/kernels.test -test.v -test.count=1 -test.run 'TestKernelTimingMLAPrefill$' > $RES/ktiming.log 2>&1; echo rc=$? >> $RES/ktiming.log)
  (cd engine/gpu && timeout 45 $D/engine.test -test.v -test.count=1 -test.run '^TestGPUMLAPrefill' > $RES/engine.log 2>&1; echo rc=$? >> $RES/engine.log)
  TILERT_GPU_MLA_PREFILL=1 timeout 40 $D/tilert bench decode --dummy-weights deepseek-v3.2 --layers 1 --prompt-len 8192 --tokens 4 --prefill-lens 1024,8192 --profile --json $RES/prefill-mla.json > $RES/prefill-mla.txt 2>&1
  TILERT_GPU_MLA_PREFILL=1 TILERT_GPU_GEMM=1 TILERT_GPU_GEMM_H2=1 TILERT_GPU_ABSORB_TC=1 TILERT_GPU_PREFILL_CHUNK=2048 timeout 40 $D/tilert bench decode --dummy-weights deepseek-v3.2 --layers 1 --prompt-len 8192 --tokens 4 --prefill-lens 1024,8192 --profile --json $RES/prefill-all.json > $RES/prefill-all.txt 2>&1
  set +x
}
for n in "$@"; do
  RES=$OUT/$n; mkdir -p $RES .device/$n; ln -f .device/final/* .device/$n/; echo | gzip > .device/$n/dummy.gz
  t0=$SECONDS
  case $n in
    mlapf) lim=200; (export RES; mlapf) > $RES/run.log 2>&1 ;;
    *) case $n in attn|pfill) lim=130;; mrows) lim=200;; fuse) lim=100;; *) lim=95;; esac; RES=$RES timeout $lim bash docs/measured/h200-2026-12-01-$n/next-run.sh > $RES/run.log 2>&1 ;;
  esac
  echo "$n rc=$? $((SECONDS - t0)) s"
done
