# Session 61's device plan (issue 10). Usage: bash docs/measured/next/s61.sh h   (binaries in .device/next: tilert,
# kernels.test, engine.test; built from main)
#  h: everything owed to an H200 in one call (~9 min), most wanted first:
#     1. the table on main (both models, 8192 and 131072, 1 and 4 slots, JSON) and the 4-slot target's rows
#        (--same-rows: the weights read once), the MTP row;
#     2. the checks of the kernels built since session 56 that no H200 has run (TestKernelQBAbsorb, TestGPUQBAbsorb,
#        TestKernelGemvSplitK, TestGPUOprojSplit, the routing probe);
#     3. A/B/A/B at 1 slot, 8192: qb_absorb's default against =0 (DeepSeek-V3.2 dims) and =2 (GLM-5 dims, which
#        auto declines); o_proj's split-K slices (both models; session 56 had o_proj at 82% of the copy rate here
#        against the H100's 92%); DeepSeek-V3.2 dims' o_proj on the spread plan;
#     4. traced steps with block clocks on both models.
#  w: the one-block top-k's keys loaded with its histogram (topk_radix_one_w12, the 8193..12288-key rows: an L2 round
#     trip off the attention front's last link on GLM-5 dims). Binaries of this commit in .device/next, main's before
#     it in .device/old: TestKernelTopKOneW, then A/B/A/B (A main's binary, B this one's, BIN=new labels B) at 1 slot,
#     8192, both models, then 131072 (the list top-k there: no change expected); traced steps with block clocks and
#     marks (TestGPUBlockMarks first): when thread 0 of the epilogue, the scores and the top-k passed each phase.
NAME=s61
. docs/measured/next/plan.sh "$1"
# oldbin: the binary to A/B against (.device/old's tilert, xz'd); abb MODEL CONTEXT NAME: A/B/A/B at 1 slot, A the old
# binary, B this one (.device/next; BIN=new labels B for internal/abab).
DN=$D; DO=$PWD/.device/old
oldbin() {
  if ls .device/old/*.xz >/dev/null 2>&1; then (cd .device/old && for f in *.xz; do xz -d -f "$f"; done); fi
  chmod +x .device/old/* 2>/dev/null
}
abb() { local m=$1 c=$2 n=$3; D=$DO bn $m $c 1 $n-A; D=$DN bn $m $c 1 $n-B BIN=new; D=$DO bn $m $c 1 $n-A2; D=$DN bn $m $c 1 $n-B2 BIN=new; }
case "$PART" in
h)
  JS=1 bn deepseek-v3.2 8192,131072 1,4 h-rows-ds; JS=1 bn glm-5 8192,131072 1,4 h-rows-glm; save
  SAMP=--same-rows JS=1 bn deepseek-v3.2 8192 1,4 h-same-ds; SAMP=--same-rows JS=1 bn glm-5 8192 1,4 h-same-glm
  MTP=1 bn deepseek-v3.2 8192 1 h-mtp-ds; save
  export TILERT_GPU_REPORT=$R/report.txt TILERT_ENGINE_REPORT=$R/engine-report.txt
  tst kernels cuda/kernels 150 'TestKernelQBAbsorb|TestKernelGemvSplitK' &
  tst engine engine/gpu 240 '^TestGPU(QBAbsorb|OprojSplit|RoutingProbe)$' & wait
  for f in kernels engine; do cnt $f; done; save
  if grep -q -- '--- FAIL' $R/kernels.log $R/engine.log; then echo "checks FAIL: no variant runs" >> $R/summary.txt; save; exit 0; fi
  abab deepseek-v3.2 8192 1 h-qb-ds TILERT_GPU_QB_ABSORB=0
  abab glm-5 8192 1 h-qb2-glm TILERT_GPU_QB_ABSORB=2; save
  abab deepseek-v3.2 8192 1 h-sp-ds TILERT_GPU_OPROJ_SPLIT=1
  abab glm-5 8192 1 h-sp-glm TILERT_GPU_OPROJ_SPLIT=1; save
  abab deepseek-v3.2 8192 1 h-op-ds TILERT_GPU_OPROJ=G64/R8_d16s/B0; save
  TL=1 bn deepseek-v3.2 8192 1 h-tl-dsc TILERT_GPU_BLOCK_CLOCKS=1; TL=1 bn glm-5 8192 1 h-tl-glmc TILERT_GPU_BLOCK_CLOCKS=1
  TL=1 bn deepseek-v3.2 8192 1 h-tl-ds; TL=1 bn glm-5 8192 1 h-tl-glm
  xz -T4 $R/h-tl-*.json 2>/dev/null; save ;;
w)
  oldbin
  tst kernels cuda/kernels 150 'TestKernelTopKOneW|TestKernelTopKRadix|TestGPUBlockMarks|TestGPUBlockClocks' ; cnt kernels; save
  if grep -q -- '--- FAIL' $R/kernels.log; then echo "top-k checks FAIL: no step runs" >> $R/summary.txt; save; exit 0; fi
  abb glm-5 8192 w-glm; abb deepseek-v3.2 8192 w-ds; save
  abb glm-5 8192 w2-glm; abb deepseek-v3.2 131072 w-ds131; save
  # Block marks (this commit): where the epilogue's, the scores' and the one-block top-k's time goes in the step.
  D=$DN TL=1 bn glm-5 8192 1 w-tl-glmc TILERT_GPU_BLOCK_CLOCKS=1; D=$DN TL=1 bn deepseek-v3.2 8192 1 w-tl-dsc TILERT_GPU_BLOCK_CLOCKS=1
  D=$DN TL=1 bn glm-5 8192 1 w-tl-glm; xz -T4 $R/w-tl-*.json 2>/dev/null; save ;;
m)
  # After call B (the marks' first clocks build failed to load: attn_epilogue's kv moved off its float4 grid): the
  # marks' device check, then traced steps with block clocks and marks on both models.
  tst kernels cuda/kernels 150 'TestGPUBlockMarks|TestGPUBlockClocks|TestKernelTopKOneW'; cnt kernels; save
  TL=1 bn glm-5 8192 1 m-tl-glmc TILERT_GPU_BLOCK_CLOCKS=1; TL=1 bn deepseek-v3.2 8192 1 m-tl-dsc TILERT_GPU_BLOCK_CLOCKS=1
  TL=1 bn deepseek-v3.2 131072 1 m-tl-ds131c TILERT_GPU_BLOCK_CLOCKS=1
  xz -T4 $R/m-tl-*.json 2>/dev/null; save ;;
e)
  # The epilogue's query blocks after call C's marks (DeepSeek-V3.2 dims: query in +1.4, scaled +3.6-4.7, stored +5.1
  # us after release; GLM-5 dims +0.9 / +2.5 / +3.7): q_a's partial sums loaded together (ss_lane_sum) and the
  # position's RoPE entries before them; qb_absorb's sum the same way (TestKernelQBAbsorb holds it to absorb_q_fast's
  # loop bit for bit). Binaries of this commit in .device/next, the commit before's tilert in
  # .device/old. Checks, then A/B/A/B (A the commit before, B this one) and marked traces.
  oldbin
  tst kernels cuda/kernels 240 'TestKernelIndexer$|TestKernelFusedAttnEpilogue|TestKernelQANormLate|TestKernelQBAbsorb|TestGPUBlockMarks'; cnt kernels; save
  if grep -q -- '--- FAIL' $R/kernels.log; then echo "epilogue checks FAIL: no step runs" >> $R/summary.txt; save; exit 0; fi
  abb deepseek-v3.2 8192 e-ds; abb glm-5 8192 e-glm; save
  abb deepseek-v3.2 8192 e2-ds; abb glm-5 8192 e2-glm; abb deepseek-v3.2 131072 e-ds131; save
  D=$DN TL=1 bn deepseek-v3.2 8192 1 e-tl-dsc TILERT_GPU_BLOCK_CLOCKS=1; D=$DN TL=1 bn glm-5 8192 1 e-tl-glmc TILERT_GPU_BLOCK_CLOCKS=1
  xz -T4 $R/e-tl-*.json 2>/dev/null; save ;;
t)
  # The one-block top-k's emit staged in shared memory and copied out coalesced (call D's marks: 1.5 us from the
  # emit's count to thread 0's last store). Built after the device time and reverted unrun (e5f167b): apply 27f4f63's
  # topk_radix.cu (`git show 27f4f63 -- cuda/kernels/cu/topk_radix.cu | git apply`), build .device/next from it and
  # .device/old's tilert from main; TestKernelTopKOneW (every body, index for index), then A/B/A/B at 8192 and a
  # marked trace.
  oldbin
  tst kernels cuda/kernels 150 'TestKernelTopKOneW'; cnt kernels; save
  if grep -q -- '--- FAIL' $R/kernels.log; then echo "top-k checks FAIL: no step runs" >> $R/summary.txt; save; exit 0; fi
  abb glm-5 8192 t-glm; abb deepseek-v3.2 8192 t-ds; save
  D=$DN TL=1 bn glm-5 8192 1 t-tl-glmc TILERT_GPU_BLOCK_CLOCKS=1; xz -T4 $R/t-tl-*.json 2>/dev/null; save ;;
*) echo "usage: s61.sh h|w|m|e|t" >&2; exit 2 ;;
esac
