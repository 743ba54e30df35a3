# NOT RUN (the device was not lent for round 2). What it checks, for a session with an H200:
# mla_decode_tcq2..16 / tcp_sa vs tcp and float64, per-row cache bases (tcp, tcq, indexer_scores_mma_rows)
# == one launch per row, tcp + combine PDL bitwise; the graph-timed table with tcq per cluster; engine
# greedy == CPU, merged == per-slot tokens, caches and graphs with TILERT_GPU_MLA_TCQ=1 and
# TILERT_GPU_SLOT_MERGE=1; `bench decode` at 4 and 1 slots with both on. Build as TEAM.md says into
# .device/attn/ (kernels.test, engine.test, tilert) and run from the repo root with RES set.
set -x; cd .device/attn && gunzip -f *.gz && chmod +x * && cd ../.. ; mkdir -p $RES
D=$PWD/.device/attn
nvidia-smi > $RES/nvidia-smi.txt 2>&1
# 1. (first NVRTC compile, then) checks on fresh random inputs: mla_decode_tcq2..16 (2 quads, cluster merge) and
#    tcp_sa vs tcp (1e-5) and vs float64; per-row cache bases (tcp, tcq, indexer scores) == one launch per row;
#    topk_radix_one (faster scan) vs CPU refTopK; tcp + combine PDL bitwise
(cd cuda/kernels && TILERT_GPU_REPORT=$RES/kernel-checks-report.txt timeout 75 $D/kernels.test -test.run 'TestKernelMLATCStaging|TestKernelSlotRows|TestKernelMLA$|TestKernelTopKRadixScratchShapes|TestKernelIndexer' -test.v > $RES/kernel-checks.log 2>&1)
# 2. graph-timed: topk one-block (new scan) vs list; tcq per cluster, tcp_sa, tcp + combine PDL, old rows
(cd cuda/kernels && TILERT_GPU_TIMING=1 TILERT_GPU_REPORT=$RES/kernel-timing-report.txt timeout 20 $D/kernels.test -test.run 'TestKernelTimingIdxMLA' -test.v > $RES/kernel-timing.log 2>&1)
# 3. engine with tcq + one launch across slots: greedy == CPU (MTP), merged == per-slot tokens, caches, graphs
(cd engine/gpu && TILERT_GPU_MLA_TCQ=1 TILERT_GPU_SLOT_MERGE=1 TILERT_ENGINE_REPORT=$RES/engine-report.txt timeout 30 $D/engine.test -test.run 'TestGPUGreedyMatchesCPU$|TestGPUSlotMergeEqualPerSlot|TestGPUCachesMatchCPU|TestGPUGraphsEqualEager' -test.v > $RES/engine-test.log 2>&1)
# 4. step, 4 slots, merged launches + tcq (whatever time is left)
TILERT_GPU_MLA_TCQ=1 TILERT_GPU_SLOT_MERGE=1 $D/tilert bench decode --device cuda --dummy-weights deepseek-v3.2 --layers 9 --context 8192 --batches 4,1 --profile --json $RES/bench-on.json > $RES/bench-on.txt 2>&1
