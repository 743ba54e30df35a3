# Not run yet (the round-2 device batch of 2026-12-01 was refused: no machine lent). What it checks,
# for the next session with a device (about 90 s; build kernels.test, engine.test and tilert into .device/async):
#  1. embed_bf16_checked (TILERT_GPU_EMBED_CHECK=1) against its CPU reference, ids outside [0, V) -> NaN rows;
#  2. the MTP pipelined step (TILERT_GPU_PIPELINE=2) and the checked embed in the engine GPU tests:
#     TestGPUPipelineMatches (mtp=false/true), TestGPUPipelineDrains, greedy == CPU (with/without MTP),
#     forced drafts, sampled MTP == plain, graphs == eager;
#  3. step p50 with MTP (1 draft) pipelined after the draft picks (=2) against the plain pipeline (=1);
#  4. step p50 at the deepseek-v3.2-moe dims (1 dense + 1 MoE layer, the HF comparison's shape), pipeline off/on.
set -x; cd .device/async && gunzip -f *.gz && chmod +x * && cd ../.. ; mkdir -p $RES
D=$PWD/.device/async
(cd cuda/kernels && timeout 55 $D/kernels.test -test.v -test.count=1 -test.run 'TestKernelNormRopeElementwise$' > $RES/kernels.log 2>&1; echo "kernels rc=$?" >> $RES/kernels.log)
grep -E '^(--- |ok|FAIL|PASS)|embed|kernels rc' $RES/kernels.log; echo "t=$SECONDS"
(cd engine/gpu && TILERT_GPU_PIPELINE=2 TILERT_GPU_EMBED_CHECK=1 timeout 30 $D/engine.test -test.v -test.count=1 \
  -test.run '^TestGPU(PipelineMatches|PipelineDrains|GreedyMatchesCPU|ForcedDrafts|SampledMTPIdentical|GraphsEqualEager)$' > $RES/engine.log 2>&1; echo "engine rc=$?" >> $RES/engine.log)
grep -E '^(--- |ok|FAIL|PASS)|ahead_test|engine rc' $RES/engine.log; echo "t=$SECONDS"
for p in 1 2; do
  left=$((70 - SECONDS)); [ $left -lt 10 ] && break
  TILERT_GPU_PIPELINE=$p timeout $(( left < 18 ? left : 18 )) $D/tilert bench decode --device cuda --dummy-weights deepseek-v3.2 --layers 9 --context 8192 --batches 1 --mtp --json $RES/bench-mtp-pipe$p.json > $RES/bench-mtp-pipe$p.txt 2>&1
  echo "bench mtp pipe=$p rc=$? t=$SECONDS"; grep -E '^ +[0-9]' $RES/bench-mtp-pipe$p.txt
done
for p in 0 1; do
  left=$((88 - SECONDS)); [ $left -lt 8 ] && break
  TILERT_GPU_PIPELINE=$p timeout $(( left < 12 ? left : 12 )) $D/tilert bench decode --device cuda --dummy-weights deepseek-v3.2 --layers 1 --context 1024,8192 --batches 1 --json $RES/bench-moe-pipe$p.json > $RES/bench-moe-pipe$p.txt 2>&1
  echo "bench moe pipe=$p rc=$? t=$SECONDS"; grep -E '^ +[0-9]' $RES/bench-moe-pipe$p.txt
done
