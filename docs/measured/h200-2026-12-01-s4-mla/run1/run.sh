set -x; cd .device/mla && gunzip -f *.gz && chmod +x * && cd ../.. ; mkdir -p $RES
D=$PWD/.device/mla
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv > $RES/smi.txt 2>&1
# 1. (first NVRTC compile, then) mla_decode_tcf / tcfq2..16 vs tcp (1e-5) at 128/16/8 heads, 1-4 rows, repeat
#    bitwise, per-row cache bases == per row; both vs float64 in TestKernelMLA (paged, sparse, dense, splits, clusters)
(cd cuda/kernels && TILERT_GPU_REPORT=$RES/kernel-checks-report.txt timeout 75 $D/kernels.test -test.run 'TestKernelMLATCF$|TestKernelMLA$' -test.count=1 -test.v > $RES/kernel-checks.log 2>&1; echo rc=$? >> $RES/kernel-checks.log)
tail -3 $RES/kernel-checks.log
# 2. graph-timed: tc, tcp, tcf (3 splits), tcq/tcfq per cluster at 1x128, 1x16, 1x8, 4x128 heads
(cd cuda/kernels && TILERT_GPU_TIMING=1 TILERT_GPU_REPORT=$RES/kernel-timing-report.txt timeout 25 $D/kernels.test -test.run 'TestKernelTimingMLATCF' -test.v > $RES/kernel-timing.log 2>&1; echo rc=$? >> $RES/kernel-timing.log)
# 3. warp stall reasons of tc / tcp / tcf / tcq / tcfq (ncu, clocks left alone)
NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
(cd cuda/kernels && TILERT_GPU_PROFILE_MLA=1 timeout 30 $NCU --clock-control none -k regex:mla_decode --section WarpStateStats --section SchedulerStats --section LaunchStats --section Occupancy --section ComputeWorkloadAnalysis $D/kernels.test -test.run 'TestKernelProfileMLA' -test.v > $RES/ncu.txt 2>&1; echo rc=$? >> $RES/ncu.txt)
# 4. engine with the cluster-merged tcf: greedy == CPU (MTP), logprobs vs CPU, HF goldens
(cd engine/gpu && TILERT_GPU_MLA_TCF=q TILERT_ENGINE_REPORT=$RES/engine-report-q.txt timeout 30 $D/engine.test -test.run 'TestGPUGreedyMatchesCPU$|TestGPUPenaltiesMatchCPU|TestGPUGolden$' -test.v > $RES/engine-q.log 2>&1; echo rc=$? >> $RES/engine-q.log)
# 5. the same with the split tcf + combine
(cd engine/gpu && TILERT_GPU_MLA_TCF=1 TILERT_ENGINE_REPORT=$RES/engine-report-1.txt timeout 30 $D/engine.test -test.run 'TestGPUGreedyMatchesCPU$|TestGPUPenaltiesMatchCPU|TestGPUGolden$' -test.v > $RES/engine-1.log 2>&1; echo rc=$? >> $RES/engine-1.log)
