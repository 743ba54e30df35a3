# Session 9, call D (main after the rule changes): the step unset vs the candidate defaults (TILERT_GPU_GEMV_MID=2
# TILERT_GPU_TOPK_FAST=1 TILERT_GPU_MLA_FEW=1), the TP-8 shard layer with them, then gpu-check with them in the
# environment: the new modules' kernel checks (the default module's PTX is unchanged since call B's whole PASS),
# every engine GPU test, the decode-node handoff, the cuda binding tests.
set -x
cd .device/next
for f in *.xz; do xz -d -f $f 2>/dev/null || python3 -c "import lzma,sys,shutil; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[1][:-3],'wb'))" $f; done
chmod +x *; ls -la; cd ../..
D=$PWD/.device/next
R=/tmp/s9d; rm -rf $R; mkdir -p $R/gc
export TILERT_KERNEL_CACHE=/tmp/tilert-kernels
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv > $R/smi.txt 2>&1
CAND="TILERT_GPU_GEMV_MID=2 TILERT_GPU_TOPK_FAST=1 TILERT_GPU_MLA_FEW=1"
for m in unset cand unset2 cand2; do
  case $m in unset*) e="env -u TILERT_GPU_GEMV_MID -u TILERT_GPU_TOPK_FAST -u TILERT_GPU_MLA_FEW" ;; *) e="env $CAND" ;; esac
  $e timeout 45 $D/tilert bench decode --device cuda --dummy-weights deepseek-v3.2 --layers 9 --context 8192 --batches 1 \
    --json $R/bench-$m.json > $R/bench-$m.txt 2>&1; echo rc=$? >> $R/bench-$m.txt
done
tar czf $OUT/d1.tgz -C $R .
(cd engine/gpu && env $CAND TILERT_GPU_TIMING=1 timeout 20 $D/engine.test -test.count=1 -test.v -test.run 'TestGPUShardLayerTiming$' > $R/shard-cand.log 2>&1; echo rc=$? >> $R/shard-cand.log)
(cd engine/gpu && env -u TILERT_GPU_GEMV_MID -u TILERT_GPU_TOPK_FAST -u TILERT_GPU_MLA_FEW TILERT_GPU_TIMING=1 timeout 20 $D/engine.test -test.count=1 -test.v -test.run 'TestGPUShardLayerTiming$' > $R/shard-unset.log 2>&1; echo rc=$? >> $R/shard-unset.log)
tar czf $OUT/d2.tgz -C $R .
env $CAND TILERT_GPU_TIMING=0 GPU_CHECK_NOBUILD=1 GPU_TEST_BIN=$D/kernels.test ENGINE_TEST_BIN=$D/engine.test DECODE_TEST_BIN=$D/decode.test \
  CUDA_TEST_BIN=$D/cuda.test GPU_CHECK_RUN='Few|TopKFast|IndexerScoresTopK|GroupMid|MoEPersist|PDL' OUT=$R/gc \
  timeout $((495 - SECONDS)) scripts/gpu-check.sh > $R/gpu-check.txt 2>&1
echo "gpu-check rc=$?" >> $R/gpu-check.txt
tar czf $OUT/d3.tgz -C $R .
grep -h " 8192 " $R/bench-*.txt; grep -h "rc=" $R/*.txt $R/*.log
grep "== gpu-check" $R/gpu-check.txt; grep -h "FAIL" $R/gc/*report*.txt | head -20
