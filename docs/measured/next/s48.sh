# Session 48's device plan (issue 10). Usage: bash docs/measured/next/s48.sh ng|gsw|gsw2|c1|h2|h3|na|dsw|x2   (binaries in .device/next)
#  ng (~5 min, any card): TILERT_GPU_L2_EVICT=nogroup (the grouped input GEMVs' weights at normal priority; s47.sh ng
#    cut to its two most telling rows): warm-up, the engine checks it touches, A/B/A/B on DeepSeek-V3.2 dims 8192
#    and GLM-5 dims 131072, 1 slot.
#  gsw (~5 min, any card): GLM-5 dims' routed experts were never swept on their own shapes: session 30 pinned
#    DeepSeek-V3.2's sweep winners (down G32/R8_o4, gate/up G64/R8_o4) and GLM-5 took them unmeasured, and an H200
#    trace (session 42 call A) had GLM-5's routed down at ~75% of the copy rate (100 MB in 33 us). One-row plans for
#    e6144x2048 (down) and p2048x6144 (gate/up), GLM-5 dims 8192, 1 slot, bracketed by the default.
#  gsw2: a winner of gsw A/B/A/B at 8192 and 131072 (PIN=... set by the caller).
#  c1 (~8 min, any card; kernels.test, engine.test, tilert): session 48's defaults (kernels.GroupNormal, the routed
#    experts' shapes by card and last wave): gpu-check's first half, then A/B/A/B against session 47's defaults set by
#    switches (TILERT_GPU_L2_EVICT=keys TILERT_GPU_EXPERT_SHAPE=30) on the four 1-slot rows and DeepSeek-V3.2 4 slots.
#  h2 (~5 min, an H200; tilert alone): the README's 1-slot rows on today's defaults (JSON), x2, then session 48's
#    defaults against session 47's (switches) on DeepSeek-V3.2 dims 8192 and GLM-5 dims 131072.
#  h3 (~3 min, an H200, a thin budget; tilert alone): the 1-slot rows (JSON), then the gate/up A/B of x2 and the
#    defaults against session 47's on DeepSeek-V3.2 dims 8192 only.
#  na (~2 min, any card; tilert alone): TILERT_GPU_L2_EVICT=noabsorb (kernels.AbsorbNormal: the absorbed MLA
#    products' weights at normal priority, built after call E): a warm-up that compiles its modules, then A/B/A/B on
#    the four 1-slot rows. Ran as call F (+26..+37 us) and removed: the value is refused now, code last in 454f910.
#  dsw (~3 min, any card; tilert alone): the dense one-row plans on today's L2 policy (q_b, the indexer's wq_b and
#    o_proj of both models were last swept on an H200 under normal loads, sessions 15-17 and 33), 8192, 1 slot,
#    bracketed by the default: a pin that wins here gets its A/B/A/B next (gsw2 with PIN=...).
#  x2 (~2 min, an H200): the gate/up variant on an H200 with evict-first loads: the default (_o4 there) against
#    TILERT_GPU_EXPERT_SHAPE=d16, DeepSeek-V3.2 dims 8192 and GLM-5 dims 131072.
NAME=s48
. docs/measured/next/plan.sh "$1"
E=TILERT_GPU_TILE_PLANS
case "$PART" in
ng)
  TILERT_GPU_L2_EVICT=nogroup timeout 300 $D/tilert bench decode --device cuda --dummy-weights glm-5 --layers 1 --context 1024 --batches 1 > $R/warm-ng.txt 2>&1
  TILERT_GPU_L2_EVICT=nogroup tst engine engine/gpu 300 '^TestGPU(GreedyMatchesCPU|SideStreamSameTokens|PipelineMatches)'
  cnt engine; save
  abab deepseek-v3.2 8192 1 ng8 TILERT_GPU_L2_EVICT=nogroup
  abab glm-5 131072 1 ngg TILERT_GPU_L2_EVICT=nogroup ;;
gsw)
  bn glm-5 8192 1 gsw-A1
  for d in G64/R8_o4/B0 G32/R4_o4/B0 G64/R4_o4/B0 G128/R8_o4/B0 G32/R8_d16/B0 G32/R8_o4/B2; do bn glm-5 8192 1 "gsw-d-${d//\//_}" $E=e6144x2048=$d; done
  for g in G32/R8_o4/B0 G128/R8_o4/B0 G64/R4_o4/B0 G64/R8_d16/B0; do bn glm-5 8192 1 "gsw-g-${g//\//_}" $E=p2048x6144=$g; done
  bn glm-5 8192 1 gsw-A2
  save ;;
gsw2)
  abab glm-5 8192 1 gp8 $E=$PIN
  abab glm-5 131072 1 gp131 $E=$PIN ;;
c1)
  check1
  O="TILERT_GPU_L2_EVICT=keys TILERT_GPU_EXPERT_SHAPE=30"
  abab deepseek-v3.2 8192 1 o8 $O; abab glm-5 8192 1 og8 $O
  abab deepseek-v3.2 131072 1 o131 $O; abab glm-5 131072 1 og131 $O
  abab deepseek-v3.2 8192 4 o4s $O ;;
h2)
  JS=1 bn deepseek-v3.2 8192,131072 1 r1-ds; JS=1 bn glm-5 8192,131072 1 r1-glm
  abab deepseek-v3.2 8192 1 x8 TILERT_GPU_EXPERT_SHAPE=d16
  abab glm-5 131072 1 xg131 TILERT_GPU_EXPERT_SHAPE=d16
  O="TILERT_GPU_L2_EVICT=keys TILERT_GPU_EXPERT_SHAPE=30"
  abab deepseek-v3.2 8192 1 o8 $O; abab glm-5 131072 1 og131 $O ;;
h3)
  JS=1 bn deepseek-v3.2 8192,131072 1 r1-ds; JS=1 bn glm-5 8192,131072 1 r1-glm
  abab deepseek-v3.2 8192 1 x8 TILERT_GPU_EXPERT_SHAPE=d16
  abab deepseek-v3.2 8192 1 o8 TILERT_GPU_L2_EVICT=keys TILERT_GPU_EXPERT_SHAPE=30 ;;
na)
  TILERT_GPU_L2_EVICT=noabsorb timeout 300 $D/tilert bench decode --device cuda --dummy-weights glm-5 --layers 1 --context 1024 --batches 1 > $R/warm-na.txt 2>&1
  abab deepseek-v3.2 8192 1 na8 TILERT_GPU_L2_EVICT=noabsorb
  abab glm-5 131072 1 nag131 TILERT_GPU_L2_EVICT=noabsorb
  abab glm-5 8192 1 nag8 TILERT_GPU_L2_EVICT=noabsorb
  abab deepseek-v3.2 131072 1 na131 TILERT_GPU_L2_EVICT=noabsorb ;;
dsw)
  bn deepseek-v3.2 8192 1 dsw-A1
  for p in G64/R8_d16/B0 G32/R8_d16/B0 G64/R8_o4/B0 G128/R8_d16/B0; do bn deepseek-v3.2 8192 1 "dsw-qb-${p//\//_}" $E=24576x1536=$p; done
  for p in G64/R8_d16/B0 G32/R8_d16/B0 G64/R4_o4/B0 G64/R8_o4/B0; do bn deepseek-v3.2 8192 1 "dsw-wqb-${p//\//_}" $E=8192x1536=$p; done
  for p in G128/R8_d16/B0 G256/R8_d16/B0 G64/R8_d16/B0 G128/R4_d16/B0; do bn deepseek-v3.2 8192 1 "dsw-o-${p//\//_}" $E=7168x16384=$p; done
  bn deepseek-v3.2 8192 1 dsw-A2
  bn glm-5 8192 1 gdsw-A1
  for p in G64/R8_d16/B0 G32/R8_d16/B0 G64/R8_o4/B0 G128/R8_d16/B0; do bn glm-5 8192 1 "gdsw-qb-${p//\//_}" $E=16384x2048=$p; done
  for p in G64/R8_d16/B0 G32/R8_d16/B0 G64/R4_o4/B0 G64/R8_o4/B0; do bn glm-5 8192 1 "gdsw-wqb-${p//\//_}" $E=4096x2048=$p; done
  for p in G128/R8_d16/B0 G256/R8_d16/B0 G64/R8_d16/B0 G128/R4_d16/B0; do bn glm-5 8192 1 "gdsw-o-${p//\//_}" $E=6144x16384=$p; done
  bn glm-5 8192 1 gdsw-A2
  save ;;
x2)
  abab deepseek-v3.2 8192 1 x8 TILERT_GPU_EXPERT_SHAPE=d16
  abab glm-5 131072 1 xg131 TILERT_GPU_EXPERT_SHAPE=d16 ;;
*) echo "usage: s48.sh ng|gsw|gsw2|c1|h2|h3|na|dsw|x2" >&2; exit 2 ;;
esac
