# Session 47's device plan (issue 10). Usage: bash docs/measured/next/s47.sh bk|b9|ck   (binaries in .device/next)
# No H200 came in sessions 43-46, and 9 MoE layers of DeepSeek-V3.2 dims need ~110 GB: every H100 row since ran 3 MoE
# layers, where the head is a third of the step. `bench decode --one-expert-bank` (gpu.DummyOneBank) points every MoE
# layer at one bank of routed experts: a step reads the same bytes, the model holds ~21 GB.
#  bk (~3 min, an H100): is one bank the same step? At LAYERS=3 (where both fit) the default against --one-expert-bank,
#    A/B/A/B, DeepSeek-V3.2 dims 8192 and GLM-5 dims 131072, 1 slot.
#  b9 (~5 min, an H100 or H200): the README's rows at 9 MoE layers with one bank (both models, 8192 and 131072, 1 and
#    4 slots, MTP at 1 and 4 slots, a traced step of each model).
#  ck (~7 min): the engine's ^TestGPU (engine.test): session 46's pinned MTP meta and no-sync HostTimes on a GPU.
#  ev (~5 min, BANK=1 on an H100): TILERT_GPU_L2_EVICT=first, the weight streams' loads evict-first in the L2: the
#    engine checks it touches with it on, A/B/A/B at 9 MoE layers (DeepSeek-V3.2 8192 1 and 4 slots, GLM-5 131072),
#    a traced step with it.
NAME=s47
. docs/measured/next/plan.sh "$1"
case "$PART" in
bk)
  export LAYERS=3; unset BANK  # both forms fit at 3 MoE layers
  # Named as abab's rows (-A, -B, -A2, -B2) so that internal/abab reads them (call A ran them as -A1 -B1 -A2 -B2).
  for i in "" 2; do
    bn deepseek-v3.2 8192 1 bk8-A$i; BANK=1 bn deepseek-v3.2 8192 1 bk8-B$i
  done
  for i in "" 2; do
    bn glm-5 131072 1 bkg-A$i; BANK=1 bn glm-5 131072 1 bkg-B$i
  done
  grep -h "loaded in" $R/bk8-A.txt $R/bk8-B.txt >> $R/summary.txt; save ;;
b9)
  export BANK=1 LAYERS=9
  rows
  MTP=1 bn glm-5 8192 1,4 glm-mtp
  grep -h -E "timeline|idle |layers \(each" $R/tl-ds.txt $R/tl-glm.txt | head -16 >> $R/summary.txt; save ;;
ck) tst engine engine/gpu 400 '^TestGPU'; cnt engine; save ;;
ev)
  # TILERT_GPU_L2_EVICT=first (kernels.WeightsEvictFirst): the weight streams evict-first in the L2. Its modules
  # compile on first use (a warm-up row), then the engine checks it touches with it on, then A/B/A/B at 9 MoE layers.
  TILERT_GPU_L2_EVICT=first timeout 300 $D/tilert bench decode --device cuda --dummy-weights glm-5 --layers 1 --context 1024 --batches 1 > $R/warm-ev.txt 2>&1
  TILERT_GPU_L2_EVICT=first tst engine engine/gpu 300 '^TestGPU(GreedyMatchesCPU|SideStreamSameTokens|Trained|PipelineMatches)'
  cnt engine; save
  abab deepseek-v3.2 8192 1 ev8 TILERT_GPU_L2_EVICT=first
  abab glm-5 131072 1 evg TILERT_GPU_L2_EVICT=first
  abab deepseek-v3.2 8192 4 ev4 TILERT_GPU_L2_EVICT=first
  TL=1 bn deepseek-v3.2 8192 1 tl-ev TILERT_GPU_L2_EVICT=first
  grep -h -E "timeline|layers \(each" $R/tl-ev.txt | head -4 >> $R/summary.txt; xz -T4 $R/tl-*.json 2>/dev/null; save ;;
ek)
  # Call C's weights-only form won at 8192 (DeepSeek-V3.2 dims -38 / -33 us) and lost at 131072 (GLM-5 dims +19 / +19):
  # keys (the indexer scores' key loads evict-first too, a key being read once a step) against the default, and
  # first against keys, at both contexts on both models.
  TILERT_GPU_L2_EVICT=keys timeout 300 $D/tilert bench decode --device cuda --dummy-weights glm-5 --layers 1 --context 1024 --batches 1 > $R/warm-ek.txt 2>&1
  grep -h -i -E "level=(WARN|ERROR)|sm_90a|indexer scores on" $R/warm-ek.txt | cut -c1-220 | head -6 >> $R/summary.txt
  abab glm-5 131072 1 ekg TILERT_GPU_L2_EVICT=keys
  abab deepseek-v3.2 8192 1 ek8 TILERT_GPU_L2_EVICT=keys
  abab deepseek-v3.2 131072 1 ek131 TILERT_GPU_L2_EVICT=keys
  abab glm-5 8192 1 ekg8 TILERT_GPU_L2_EVICT=keys
  abab glm-5 131072 1 efg TILERT_GPU_L2_EVICT=first ;;
kd)
  # keys won on all four 1-slot rows (call D): the engine checks with it on, then the 4-slot and MTP rows A/B/A/B.
  TILERT_GPU_L2_EVICT=keys timeout 300 $D/tilert bench decode --device cuda --dummy-weights glm-5 --layers 1 --context 1024 --batches 1 > $R/warm-ek.txt 2>&1
  TILERT_GPU_L2_EVICT=keys tst engine engine/gpu 300 '^TestGPU(GreedyMatchesCPU|SideStreamSameTokens|Trained|PipelineMatches|ForcedDrafts|SampledMTPIdentical|PenaltiesMatchCPU)'
  cnt engine; save
  abab deepseek-v3.2 8192 4 ek4 TILERT_GPU_L2_EVICT=keys
  MTP=1 abab deepseek-v3.2 8192 1 ekm TILERT_GPU_L2_EVICT=keys
  abab glm-5 131072 4 ekg4 TILERT_GPU_L2_EVICT=keys ;;
c1)
  # keys as the default (kernels.EvictFirst): gpu-check's first half (the kernel checks and the engine's ^TestGPU),
  # then the 1-slot rows (BANK=1 on a card under 100 GB) and one A/B/A/B against normal.
  check1
  bn deepseek-v3.2 8192,131072 1 r1-ds; bn glm-5 8192,131072 1 r1-glm
  abab deepseek-v3.2 8192 1 nm8 TILERT_GPU_L2_EVICT=normal ;;
r1)
  # A thin budget on an H200: the README's 1-slot rows on today's defaults (tilert alone).
  JS=1 bn deepseek-v3.2 8192,131072 1 r1-ds; JS=1 bn glm-5 8192,131072 1 r1-glm ;;
ng)
  # TILERT_GPU_L2_EVICT=nogroup (kernels.GroupNormal): the default but the grouped input GEMVs' weights at normal
  # priority (call G's trace had that launch ~1.2 us a layer slower with evict-first). Its modules compile on first
  # use (a warm-up row); the engine checks it touches; A/B/A/B on the four 1-slot rows.
  TILERT_GPU_L2_EVICT=nogroup timeout 300 $D/tilert bench decode --device cuda --dummy-weights glm-5 --layers 1 --context 1024 --batches 1 > $R/warm-ng.txt 2>&1
  TILERT_GPU_L2_EVICT=nogroup tst engine engine/gpu 300 '^TestGPU(GreedyMatchesCPU|SideStreamSameTokens|PipelineMatches)'
  cnt engine; save
  abab deepseek-v3.2 8192 1 ng8 TILERT_GPU_L2_EVICT=nogroup
  abab glm-5 131072 1 ngg TILERT_GPU_L2_EVICT=nogroup
  abab deepseek-v3.2 131072 1 ng131 TILERT_GPU_L2_EVICT=nogroup
  abab glm-5 8192 1 ngg8 TILERT_GPU_L2_EVICT=nogroup ;;
*) echo "usage: s47.sh bk|b9|ck|ev|ek|kd|c1|r1|ng" >&2; exit 2 ;;
esac
