# Session 29's plan for the next device session (issue 10; NOT RUN). Binaries of main in .device/next, xz'd or not
# (the build line in docs/measured/next/README.md; all six fit one call's carry with the tree). Ask `status` first;
# issue each call right after the last (a machine stays warm ~30 s).
# Usage: bash docs/measured/next/s30.sh lead|warm|plans|shape|check1|check2|gpucheck|final
#  lead (~5 min; engine.test, kernels.test, tilert): what session 29 built after its device time.
#    - The load: --dummy-weights sends each vocabulary table and the head as one period and fills it on the device
#      (engine/gpu weights.go periodic). Session 29's rows read `loaded in` 16.4-18.4 s; each row's header says it now.
#    - auto raises two-row steps within 32768 keys too (engine/gpu prio.go stepRaised), measured only as =q (calls D-F:
#      -9..-15 us at 2 slots, 8192). A/B/A/B against =0 at 2 slots, and MTP (its verify step has two rows; ±100 us of
#      noise between runs, so three pairs). If it loses, stepRaised goes back to rows == 1.
#    - GLM-5 at 2 slots with =q (auto leaves GLM-5 alone: +6 us at 1 slot in session 28, never run at 2 rows).
#    - The shared expert uncapped (TILERT_GPU_SIDE_CAP=sh=0) now that auto raises it with the main chain: session 29's
#      trace has it at one block an SM beside the MoE front (103.1-119.7 us into the layer, 29 MB at 1.75 TB/s) and its
#      down GEMV beside the routed experts'; uncapped it was neutral without priorities (session 16), and uncapped at the
#      least priority it starved (session 28). Env only.
#    - Traces at 2 and 4 slots (DeepSeek-V3.2, 8192): no several-row step was traced since the side streams and
#      priorities changed; 4 slots is 73% of the floor, as far from it as 1 slot.
#  check1 / check2 / gpucheck / final: as plan.sh.
NAME=s30; . docs/measured/next/plan.sh "$1"
case "$P" in
lead)
  tst kernels cuda/kernels 120 'TestLaunchPriority$'; cnt kernels
  tst engine engine/gpu 300 'TestGPUPriorityScoped$|TestGPUSideStreamSameTokens$|TestDummy'; cnt engine
  bn deepseek-v3.2 8192 1 ds-load; grep -h "loaded in" $R/ds-load.txt >> $R/summary.txt
  abab deepseek-v3.2 8192 2 two TILERT_GPU_MAIN_PRIO=0
  for r in 1 2 3; do
    MTP=1 bn deepseek-v3.2 8192 1 mtp-def$r
    MTP=1 bn deepseek-v3.2 8192 1 mtp-off$r TILERT_GPU_MAIN_PRIO=0
  done
  abab glm-5 8192 2 glm2 TILERT_GPU_MAIN_PRIO=q
  abab deepseek-v3.2 8192 1 sh0 TILERT_GPU_SIDE_CAP=sh=0
  TL=1 bn deepseek-v3.2 8192 2 tl-ds2
  TL=1 bn deepseek-v3.2 8192 4 tl-ds4
  xz -T4 $R/tl-*.json 2>/dev/null; save ;;
warm)
  # o_proj's weights read into the L2 beside the attention's tail (engine/gpu warm.go, TILERT_GPU_L2WARM; NOT RUN before)
  tst kernels cuda/kernels 120 'TestKernelL2Warm$'; cnt kernels
  tst engine engine/gpu 300 'TestGPUSideStreamSameTokens$'; cnt engine
  abab deepseek-v3.2 8192 1 w25 TILERT_GPU_L2WARM=25
  for v in 12 50 25,b=264 25,b=33 25,p=16384; do bn deepseek-v3.2 8192 1 "w$v" TILERT_GPU_L2WARM=$v; done
  bn deepseek-v3.2 8192 1 w-A3
  abab deepseek-v3.2 131072 1 w25l TILERT_GPU_L2WARM=25
  abab glm-5 8192 1 w25g TILERT_GPU_L2WARM=25
  TL=1 bn deepseek-v3.2 8192 1 tl-w25 TILERT_GPU_L2WARM=25
  xz -T4 $R/tl-*.json 2>/dev/null; save ;;
plans)
  # The routed experts' launches on pinned tile plans (TILERT_GPU_TILE_PLANS e / p, session 30; NOT RUN before): the
  # down GEMV streams ~3.5 TB/s in the 1-slot trace (132 MB in 37 us with the shared expert's), the gate/up ~3.8.
  tst kernels cuda/kernels 200 'TestKernelGemvTile$|TestKernelTilePlanBitwise$'; cnt kernels
  tst engine engine/gpu 100 'TestParseTilePlans$|TestTilePlansPin$'; cnt engine
  E=TILERT_GPU_TILE_PLANS
  bn deepseek-v3.2 8192 1 p-A1
  for d in G64/R8_d16/B0 G64/R4_o4/B0 G64/R8_o4/B4 G64/R8/B0 G64/R4_d16/B0 G32/R8_o4/B0 G128/R8_d16/B0; do
    bn deepseek-v3.2 8192 1 "d-${d//\//_}" $E=e7168x2048=$d; done
  bn deepseek-v3.2 8192 1 p-A2
  for g in G64/R8_o4/B0 G64/R4_d16/B0 G64/R8_d16/B2 G128/R8_d16/B0 G32/R8_d16/B0; do
    bn deepseek-v3.2 8192 1 "g-${g//\//_}" $E=p2048x7168=$g; done
  bn deepseek-v3.2 8192 1 p-A3
  # the fastest of each, together, A/B/A/B, and at 4 slots
  bd=$(grep '^d-' $R/summary.txt | sort -k5 -n | head -1 | awk '{print $2}' | sed 's/.*=//')
  bg=$(grep '^g-' $R/summary.txt | sort -k5 -n | head -1 | awk '{print $2}' | sed 's/.*=//')
  echo "best down $bd, best gate/up $bg" | tee -a $R/summary.txt
  abab deepseek-v3.2 8192 1 best $E=e7168x2048=$bd,p2048x7168=$bg
  abab deepseek-v3.2 8192 4 best4 $E=e7168x2048=$bd,p2048x7168=$bg
  save ;;
shape)
  # kernels.OneRowExperts, the default from this build (calls E-F's winning pins as a rule for a single row's experts;
  # TILERT_GPU_EXPERT_SHAPE=0 goes back): gpu-check's first half, the A/Bs, the README's rows, the second half.
  check1
  abab deepseek-v3.2 8192 1 sh TILERT_GPU_EXPERT_SHAPE=0
  abab deepseek-v3.2 131072 1 shl TILERT_GPU_EXPERT_SHAPE=0
  abab glm-5 8192 1 shg TILERT_GPU_EXPERT_SHAPE=0
  rows
  check2 ;;
check1) check1 ;;
check2) check2 ;;
gpucheck) gpucheck ;;
final) rows
  # auto's two-row rule on the MTP verify step: call A's three pairs read 5.026 / 5.025 / 4.976 against 4.889 / 5.021 / 4.994
  for r in 4 5 6 7; do
    MTP=1 bn deepseek-v3.2 8192 1 mtp-def$r
    MTP=1 bn deepseek-v3.2 8192 1 mtp-off$r TILERT_GPU_MAIN_PRIO=0
  done
  TL=1 bn deepseek-v3.2 131072 1 tl-ds131
  xz -T4 $R/tl-*.json 2>/dev/null; save ;;
*) echo "usage: s30.sh lead|warm|plans|shape|check1|check2|gpucheck|final" >&2; exit 2 ;;
esac
