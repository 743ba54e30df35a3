# Session 30's plan for the next device session (issue 10; NOT RUN). Binaries of main in .device/next, xz'd or not
# (the build line in docs/measured/next/README.md; all six fit one call's carry with the tree). Ask `status` first;
# issue each call right after the last (a machine stays warm ~30 s).
# Usage: bash docs/measured/next/s31.sh lead|sweep|m2|qb|cap|check1|check2|gpucheck|final
#  lead (~4 min; kernels.test, engine.test, tilert): kernels.OneRowExperts as session 30 left it (5da8487), built after its
#    device time and NOT RUN: a single row's routed-expert launches (8 slots shaped as 9, no shared slot) stream their
#    gate/up on _o4 and their down on groups of 32; the shared expert's launch keeps the tile rule's shapes. Session 30
#    timed exactly these launches through pins (TILERT_GPU_TILE_PLANS e/p: 2.600 / 2.599 and 2.606 / 2.606 against
#    2.625 / 2.622 and 2.629 / 2.627 at 8192; 2.756 / 2.754 against 2.775 / 2.777 at 131072; GLM-5 unchanged) and the
#    rule on the shared expert's launch too (no gain). If the default does not read ~-20 us against
#    TILERT_GPU_EXPERT_SHAPE=0 at 8192 and 131072, set kernels.OneRowExperts false and say why.
#  sweep (~2 min, env only): the routed experts' tile plans at 2 and 4 slots.
#  m2 (~3 min): TILERT_GPU_TILE_M2=d16 (kernels.TileM2D16, NOT RUN): checks, 2 slots and MTP A/Bs, a trace.
#  qb (~1.5 min, env only): DeepSeek-V3.2's q_b (24576x1536) and the indexer's wq_b (8192x1536) on other tile plans at
#    8192, 1 slot (G32: 3 chunks a thread of a 1536-byte row, none idle; G64 leaves half the threads a chunk short).
#  cap (~1 min, env only): DeepSeek-V3.2's late q chain at 131072 capped at one block an SM instead of two, traced.
#  check1 / check2 / gpucheck / final: as plan.sh (gpucheck on the rule's final form: session 30 ran it on fac949a only).
NAME=s31; . docs/measured/next/plan.sh "$1"
case "$PART" in
lead)
  tst kernels cuda/kernels 200 'TestKernelGemvTile$|TestKernelTileVariantsBitwise$|TestTileLaunchShape$|TestKernelTilePlanBitwise$'; cnt kernels
  tst engine engine/gpu 300 'TestGPUSideStreamSameTokens$|TestGPUGreedyMatchesCPU$'; cnt engine
  abab deepseek-v3.2 8192 1 rule TILERT_GPU_EXPERT_SHAPE=0
  abab deepseek-v3.2 131072 1 rulel TILERT_GPU_EXPERT_SHAPE=0
  abab glm-5 8192 1 ruleg TILERT_GPU_EXPERT_SHAPE=0
  bn deepseek-v3.2 8192 2,4 several; bn deepseek-v3.2 8192 2,4 several0 TILERT_GPU_EXPERT_SHAPE=0
  TL=1 bn deepseek-v3.2 8192 1 tl-rule
  xz -T4 $R/tl-*.json 2>/dev/null; save ;;
sweep)
  # Env only (~2 min): the routed experts' plans at 2 and 4 slots (16 / 32 slots a launch), where session 30's one-row
  # pair lost (+44 / +57 us). If one wins twice, OneRowExperts' rule can take that shape there (kernels gemv_tile.go).
  E=TILERT_GPU_TILE_PLANS
  for b in 2 4; do
    bn deepseek-v3.2 8192 $b sw$b-A1
    for d in G64/R8_d16/B0 G64/R4_o4/B0 G128/R8_o4/B0 G32/R8_o4/B0; do bn deepseek-v3.2 8192 $b "sw$b-d-${d//\//_}" $E=e7168x2048=$d; done
    for g in G64/R8_o4/B0 G128/R8_d16/B0 G64/R4_d16/B0; do bn deepseek-v3.2 8192 $b "sw$b-g-${g//\//_}" $E=p2048x7168=$g; done
    bn deepseek-v3.2 8192 $b sw$b-A2
  done
  save ;;
m2)
  # kernels.TileM2D16 (TILERT_GPU_TILE_M2=d16, opt-in, built in session 30 after its device time, NOT RUN): the dense
  # fp8 GEMVs of two rows (o_proj at 2 slots and in the MTP verify: 39.2 us charged against 32.7 at one row on _d16)
  # on gemv_tile_fp8_r4_m2_d16, 16 loads in flight. Checks, then 2 slots A/B/A/B and three MTP pairs.
  tst kernels cuda/kernels 200 'TestKernelTileM2D16Bitwise$|TestNVRTCTileLoadsInFlight$'; cnt kernels
  (export TILERT_GPU_TILE_M2=d16; tst engine engine/gpu 300 'TestGPUGreedyMatchesCPU$|TestGPUSideStreamSameTokens$'); cnt engine
  abab deepseek-v3.2 8192 2 m2 TILERT_GPU_TILE_M2=d16
  abab glm-5 8192 2 m2g TILERT_GPU_TILE_M2=d16
  for r in 1 2 3; do MTP=1 bn deepseek-v3.2 8192 1 m2mtp-A$r; MTP=1 bn deepseek-v3.2 8192 1 m2mtp-B$r TILERT_GPU_TILE_M2=d16; done
  TL=1 bn deepseek-v3.2 8192 2 tl-m2 TILERT_GPU_TILE_M2=d16
  xz -T4 $R/tl-*.json 2>/dev/null; save ;;
qb)
  E=TILERT_GPU_TILE_PLANS
  bn deepseek-v3.2 8192 1 qb-A1
  for p in G32/R8_d16/B0 G32/R4_d16/B0 G32/R8_o4/B0 G64/R4_o4/B0 G128/R8_d16/B0; do bn deepseek-v3.2 8192 1 "qb-${p//\//_}" $E=24576x1536=$p; done
  for p in G32/R8_d16/B0 G32/R8_o4/B0 G64/R4_o4/B0; do bn deepseek-v3.2 8192 1 "wqb-${p//\//_}" $E=8192x1536=$p; done
  bn deepseek-v3.2 8192 1 qb-A2
  save ;;
cap)
  # Session 30's 131072 trace: the capped late q_b (264 blocks of 128 registers, two an SM) fills every SM's register
  # file from 24 to 48 us, so the mark_lw top-k's 129 blocks (32 registers x 1024 threads) find no room until it ends
  # (top-k 36.3 -> 57.6 us, 12 us alone). One q_b block an SM leaves room for one top-k block beside it. Never measured
  # with mark_lw (session 26's q=1 2.805 against 2.812 ran mark_l).
  abab deepseek-v3.2 131072 1 cap1 TILERT_GPU_SIDE_CAP=q=1
  TL=1 bn deepseek-v3.2 131072 1 tl-l
  TL=1 bn deepseek-v3.2 131072 1 tl-cap1 TILERT_GPU_SIDE_CAP=q=1
  xz -T4 $R/tl-*.json 2>/dev/null; save ;;
check1) check1 ;;
check2) check2 ;;
gpucheck) gpucheck ;;
final) rows ;;
*) echo "usage: s31.sh lead|sweep|m2|qb|cap|check1|check2|gpucheck|final" >&2; exit 2 ;;
esac
