set -x; cd .device/mla && gunzip -f *.gz && chmod +x * && cd ../.. ; mkdir -p $RES
D=$PWD/.device/mla
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv > $RES/smi.txt 2>&1
# 1. (first NVRTC compile, then) tcf2 (the new default), tcf8, tcf with the new tile issue and prologue vs tcp and
#    float64; rows (slots) == per row for tcf / tcf2 / tcf8
(cd cuda/kernels && TILERT_GPU_REPORT=$RES/kernel-checks-report.txt timeout 55 $D/kernels.test -test.run 'TestKernelMLATCF$|TestKernelMLA$' -test.count=1 -test.v > $RES/kernel-checks.log 2>&1; echo rc=$? >> $RES/kernel-checks.log)
tail -2 $RES/kernel-checks.log
# 2. engine with the new defaults (tcf2, launches across slots): greedy == CPU (MTP), merged == per slot, logprobs,
#    logits vs emulator, graphs, pipeline, caches, goldens, drafts, the sharded engine
(cd engine/gpu && TILERT_ENGINE_REPORT=$RES/engine-report.txt timeout 40 $D/engine.test -test.run 'TestGPUGreedyMatchesCPU$|TestGPUSlotMergeEqualPerSlot|TestGPUPenaltiesMatchCPU|TestGPULogitsMatchEmulator|TestGPUGraphsEqualEager|TestGPUPipelineMatches|TestGPUCachesMatchCPU|TestGPUGolden$|TestGPUForcedDrafts|TestGPUSampledMTPIdentical|TestGPUShardGreedy$|TestGPUShardServingLogits' -test.v > $RES/engine.log 2>&1; echo rc=$? >> $RES/engine.log)
grep -E "^(--- |ok|PASS|FAIL)|rc=" $RES/engine.log | tail -20
# 3. graph-timed: tc, tcp, tcf, tcf2, tcf8 (3 splits), stage-dropped tcf; 1x128, 1x16, 1x8, 4x128
(cd cuda/kernels && TILERT_GPU_TIMING=1 TILERT_GPU_REPORT=$RES/kernel-timing-report.txt timeout 15 $D/kernels.test -test.run 'TestKernelTimingMLATCF' -test.v > $RES/kernel-timing.log 2>&1; echo rc=$? >> $RES/kernel-timing.log)
