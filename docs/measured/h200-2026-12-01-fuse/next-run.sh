# fuse round 2, NOT RUN (no device was lent at 20:09 UTC). What it checks, for a session with a device:
# new kernels not yet on a GPU (attn_epilogue_pf, add_rmsnorm_pf) bitwise vs the launches they extend,
# the opt-in paths' step time against the default in one run (TILERT_GPU_L2PF=1, TILERT_GPU_GROUP=3),
# their engine check (grouped modes token/byte-equal), and the L2-prefetch graph timing (o_proj MB sweep).
# Build as TEAM.md says (kernels.test, engine.test, tilert into .device/fuse/), then from the repo root:
#   RES=/tmp/res-fuse timeout 90 bash docs/measured/h200-2026-12-01-fuse/next-run.sh
set -x; cd .device/fuse && gunzip -f *.gz && chmod +x * && cd ../.. ; mkdir -p $RES
D=$PWD/.device/fuse
ts() { echo "T $(date +%s.%N) $*" >> $RES/times.txt; }
ts start
(cd cuda/kernels && TILERT_GPU_REPORT=$RES/checks-report.txt timeout 35 $D/kernels.test -test.count=1 \
  -test.run '^(TestKernelSmallFast|TestKernelFusedAttnEpilogue|TestKernelFusedRouterRoute)$' 2>&1 | tail -20 | tee $RES/checks.txt)
ts checks
TILERT_GPU_L2PF=1 timeout 30 $D/tilert bench decode --device cuda --dummy-weights deepseek-v3.2 --layers 9 --context 8192 --batches 1 --json $RES/bench-l2pf.json 2>&1 | tail -4 | tee $RES/bench-l2pf.txt
ts bench-l2pf
timeout 30 $D/tilert bench decode --device cuda --dummy-weights deepseek-v3.2 --layers 9 --context 8192 --batches 1 --json $RES/bench-default.json 2>&1 | tail -4 | tee $RES/bench-default.txt
ts bench-default
TILERT_GPU_GROUP=3 timeout 30 $D/tilert bench decode --device cuda --dummy-weights deepseek-v3.2 --layers 9 --context 8192 --batches 1 --json $RES/bench-group3.json 2>&1 | tail -4 | tee $RES/bench-group3.txt
ts bench-group3
(cd engine/gpu && timeout 30 $D/engine.test -test.count=1 -test.run '^TestGPUGroupedProjectionsEqualSeparate$' 2>&1 | tail -10 | tee $RES/engine.txt)
ts engine
(cd cuda/kernels && TILERT_GPU_TIMING=1 TILERT_GPU_REPORT=$RES/timing-report.txt timeout 20 $D/kernels.test -test.count=1 \
  -test.run '^TestKernelL2PrefetchTiming$' 2>&1 | tail -20 | tee $RES/timing.txt)
ts timing
