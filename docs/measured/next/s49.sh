# Session 49's device plan (issue 10). Usage: bash docs/measured/next/s49.sh l2|sw|h4|c49   (binaries in .device/next)
#  sw (~6 min, any card; tilert alone): the one-row knobs last tuned on an H200 under normal L2 loads, swept on today's
#    evict-first policy at 8192, 1 slot, each group bracketed by the default: the dense one-row plans (s48.sh dsw: q_b,
#    the indexer's wq_b, o_proj of both models), the side streams' tile caps (TILERT_GPU_SIDE_CAP q= / sh=) and the
#    launch priorities (TILERT_GPU_MAIN_PRIO=0). The best of each group, where it is ahead of the brackets' mean by
#    more than 6 us, then gets its A/B/A/B at 8192 in the same call (a single row is within ~5-10 us of itself).
#  l2 (~5 min, any card; kernels.test, engine.test, tilert of b538f47): TILERT_GPU_L2_NEXT (built this session, ran as
#    call A: +16..+65 us a step, removed; the value is refused now, code last in b538f47): the next layer's input
#    projections asked into the L2 beside a MoE layer's routed experts. A warm-up
#    that compiles the main module, TestKernelL2Prefetch and the engine checks it touches (TestGPUL2Next,
#    GreedyMatchesCPU, SideStreamSameTokens), then A/B/A/B: =group on DeepSeek-V3.2 dims 8192, GLM-5 dims 8192 and
#    131072, =wqb on DeepSeek-V3.2 dims 8192 and GLM-5 dims 8192, 1 slot; =group at 4 slots.
#  h4 (~5 min, an H200; tilert alone, main's final binaries): the README's 1-slot rows (JSON), then A/B/A/B on
#    DeepSeek-V3.2 dims 8192: the gate/up on _d16 (ExpertPair on an H200 is _o4, from session 30's normal-load sweep),
#    TILERT_GPU_WHOLE_CHUNKS=0 (session 49's rule, never run on an H200), and today's defaults against session 47's
#    (TILERT_GPU_L2_EVICT=keys TILERT_GPU_EXPERT_SHAPE=30 TILERT_GPU_WHOLE_CHUNKS=0), the last on GLM-5 dims 131072 too.
#  c49 (~8 min, any card; kernels.test, engine.test, tilert): gpu-check's first half on session 49's defaults, then
#    A/B/A/B against TILERT_GPU_WHOLE_CHUNKS=0 on DeepSeek-V3.2 dims 8192 and 131072.
NAME=s49
. docs/measured/next/plan.sh "$1"
E=TILERT_GPU_TILE_PLANS
# p50 NAME: a bn row's p50 ms (empty if it failed).
p50() { grep -E "^ +[0-9]+ +[0-9]+ +[0-9.]+ " $R/$1.txt | head -1 | awk '{print $3}'; }
# grp MODEL TAG VAR=value...: one bracketed group; each candidate's row named TAG-i; the best is picked into $R/pick-TAG
# as "MODEL VAR=value" when it beats the brackets' mean by more than 6 us.
grp() {
  local m=$1 t=$2; shift 2; local i=0 best="" bv=9; bn $m 8192 1 $t-A1
  for v in "$@"; do i=$((i + 1)); bn $m 8192 1 $t-$i $v; local p=$(p50 $t-$i); [ -n "$p" ] && awk "BEGIN{exit !($p < $bv)}" && { bv=$p; best=$v; }; done
  bn $m 8192 1 $t-A2
  local a=$(awk "BEGIN{print ($(p50 $t-A1) + $(p50 $t-A2)) / 2}")
  echo "group $t: brackets mean $a, best $best $bv" | tee -a $R/summary.txt
  awk "BEGIN{exit !($bv < $a - 0.006)}" && echo "$m $best" > $R/pick-$t
}
case "$PART" in
l2)
  TILERT_GPU_L2_NEXT=group timeout 300 $D/tilert bench decode --device cuda --dummy-weights glm-5 --layers 1 --context 1024 --batches 1 > $R/warm-l2.txt 2>&1
  tst kernels cuda/kernels 200 '^TestKernelL2Prefetch$' &
  TILERT_GPU_L2_NEXT=group tst engine engine/gpu 300 '^TestGPU(L2Next|GreedyMatchesCPU|SideStreamSameTokens)$'; wait
  cnt kernels; cnt engine; save
  abab deepseek-v3.2 8192 1 g8 TILERT_GPU_L2_NEXT=group
  abab glm-5 8192 1 gg8 TILERT_GPU_L2_NEXT=group
  abab glm-5 131072 1 gg131 TILERT_GPU_L2_NEXT=group
  abab deepseek-v3.2 8192 1 w8 TILERT_GPU_L2_NEXT=wqb
  abab glm-5 8192 1 gw8 TILERT_GPU_L2_NEXT=wqb
  abab deepseek-v3.2 8192 4 g8s4 TILERT_GPU_L2_NEXT=group ;;
sw)
  grp deepseek-v3.2 qb $E=24576x1536=G64/R8_d16/B0 $E=24576x1536=G32/R8_d16/B0 $E=24576x1536=G64/R8_o4/B0 $E=24576x1536=G128/R8_d16/B0
  grp deepseek-v3.2 wqb $E=8192x1536=G64/R8_d16/B0 $E=8192x1536=G32/R8_d16/B0 $E=8192x1536=G64/R4_o4/B0 $E=8192x1536=G64/R8_o4/B0
  grp deepseek-v3.2 o $E=7168x16384=G128/R8_d16/B0 $E=7168x16384=G256/R8_d16/B0 $E=7168x16384=G64/R8_d16/B0 $E=7168x16384=G128/R4_d16/B0
  grp deepseek-v3.2 cap TILERT_GPU_SIDE_CAP=q=0 TILERT_GPU_SIDE_CAP=q=2 TILERT_GPU_SIDE_CAP=sh=0 TILERT_GPU_SIDE_CAP=sh=2 TILERT_GPU_MAIN_PRIO=0
  grp glm-5 gqb $E=16384x2048=G64/R8_d16/B0 $E=16384x2048=G32/R8_d16/B0 $E=16384x2048=G64/R8_o4/B0 $E=16384x2048=G128/R8_d16/B0
  grp glm-5 gwqb $E=4096x2048=G64/R8_d16/B0 $E=4096x2048=G32/R8_d16/B0 $E=4096x2048=G64/R4_o4/B0 $E=4096x2048=G64/R8_o4/B0
  grp glm-5 go $E=6144x16384=G128/R8_d16/B0 $E=6144x16384=G256/R8_d16/B0 $E=6144x16384=G64/R8_d16/B0 $E=6144x16384=G128/R4_d16/B0
  grp glm-5 gcap TILERT_GPU_SIDE_CAP=q=1 TILERT_GPU_SIDE_CAP=q=2 TILERT_GPU_SIDE_CAP=sh=0 TILERT_GPU_SIDE_CAP=sh=2 TILERT_GPU_MAIN_PRIO=0
  save
  for f in $R/pick-*; do [ -e "$f" ] || continue; read m v < $f; abab $m 8192 1 "ab-$(basename $f)" $v; done; save ;;
h4)
  JS=1 bn deepseek-v3.2 8192,131072 1 r1-ds; JS=1 bn glm-5 8192,131072 1 r1-glm
  abab deepseek-v3.2 8192 1 x8 TILERT_GPU_EXPERT_SHAPE=d16
  abab deepseek-v3.2 8192 1 wc8 TILERT_GPU_WHOLE_CHUNKS=0
  O="TILERT_GPU_L2_EVICT=keys TILERT_GPU_EXPERT_SHAPE=30 TILERT_GPU_WHOLE_CHUNKS=0"
  abab deepseek-v3.2 8192 1 o8 $O; abab glm-5 131072 1 og131 $O ;;
c49)
  check1
  abab deepseek-v3.2 8192 1 wc8 TILERT_GPU_WHOLE_CHUNKS=0
  abab deepseek-v3.2 131072 1 wc131 TILERT_GPU_WHOLE_CHUNKS=0 ;;
*) echo "usage: s49.sh l2|sw|h4|c49" >&2; exit 2 ;;
esac
