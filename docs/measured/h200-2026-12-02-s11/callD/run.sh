# Session 11 call D: the whole engine gpu-check with this session's defaults (programmatic launches in the engine,
# side streams on, side tile GEMVs capped at 1 block per SM), the decode hand-off and the cuda binding tests. The
# kernel checks are not re-run (no kernel changed this session; the tile cap is the tested forceTileB path).
set -x
cd .device/next && for f in *.xz; do xz -d -f "$f"; done; chmod +x *; cd ../..
D=$PWD/.device/next
R=/tmp/s11d; rm -rf $R; mkdir -p $R/gc
export TILERT_KERNEL_CACHE=/tmp/tilert-kernels
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv > $R/smi.txt 2>&1
TILERT_GPU_TIMING=0 GPU_CHECK_RUN='^$' GPU_CHECK_NOBUILD=1 GPU_TEST_BIN=$D/kernels.test ENGINE_TEST_BIN=$D/engine.test \
  DECODE_TEST_BIN=$D/decode.test CUDA_TEST_BIN=$D/cuda.test OUT=$R/gc timeout 540 scripts/gpu-check.sh > $R/gpu-check.txt 2>&1
echo "gpu-check rc=$?" >> $R/gpu-check.txt
grep -E "^== gpu-check" $R/gpu-check.txt; grep -E "FAIL" $R/gc/*.log $R/gc/*.txt | head -20; tail -3 $R/gpu-check.txt
grep -E "^--- (FAIL|PASS)" $R/gc/engine-test.log | awk '{print $2}' | sort | uniq -c
gzip -9 $R/gc/*.log
tar czf $OUT/d.tgz -C $R .
