set -x; cd .device/attn && gunzip -f *.gz && chmod +x * && cd ../.. ; mkdir -p $RES
D=$PWD/.device/attn
nvidia-smi > $RES/nvidia-smi.txt 2>&1
# 1. (first NVRTC compile, then) kernel checks vs CPU references / old kernels on fresh random inputs:
#    mla_decode_tcp == mla_decode_tc bitwise (1..4 rows, 24..128 heads, 1..32 splits); MLA tcp vs float64;
#    radix top-k one-block final (topk_radix_one8/16/32) vs CPU refTopK (ties, lens, narrow, 8 rows) + scratch reuse
(cd cuda/kernels && TILERT_GPU_REPORT=$RES/kernel-checks-report.txt timeout 100 $D/kernels.test -test.run 'TestKernelMLATCStaging|TestKernelTopKRadixScratchShapes|TestKernelIndexer|TestKernelMLA$' -test.v > $RES/kernel-checks.log 2>&1)
# 2. graph-timed table: topk one-block vs list; mla_decode_tcp split sweep + stage-dropped variants; old rows
(cd cuda/kernels && TILERT_GPU_TIMING=1 TILERT_GPU_REPORT=$RES/kernel-timing-report.txt timeout 60 $D/kernels.test -test.run 'TestKernelTimingIdxMLA' -test.v > $RES/kernel-timing.log 2>&1)
# 3. engine greedy == CPU with both new paths on
(cd engine/gpu && TILERT_GPU_MLA_TCP=1 TILERT_GPU_TOPK_ONE=1 TILERT_ENGINE_REPORT=$RES/engine-report.txt timeout 40 $D/engine.test -test.run 'TestGPUGreedyMatchesCPU$|TestGPUCachesMatchCPU' -test.v > $RES/engine-test.log 2>&1)
# 4. step with both on (whatever time is left)
TILERT_GPU_MLA_TCP=1 TILERT_GPU_TOPK_ONE=1 $D/tilert bench decode --device cuda --dummy-weights deepseek-v3.2 --layers 9 --context 8192 --batches 1 --profile --json $RES/bench-on.json > $RES/bench-on.txt 2>&1
