# The plan for the next device session (issue 10; NOT RUN): session 31's (s32.sh until session 33), with session 32's
# fused launches. Binaries of main in .device/next, xz'd or not (the build line in docs/measured/next/README.md;
# all six fit one call's carry with the tree). Ask `status` first; issue each call right after the last (a machine stays
# warm ~30 s). Session 31 ran s31.sh lead and m2 (its copy is in docs/measured/h200-2026-12-04-s31); sessions 32 and 33
# had no machine, so gpu-check has not run on today's main.
# Session 34 ran k2 (call A: the fused pair and solo slower, removed with their parts an / fuse / solo / k2).
# Session 35 (no device) added fold (TILERT_GPU_ROUTER_FOLD=1, the router folded through o_proj); session 38 ran it on an
# H100 (call A: slower everywhere) and it was removed with its part fold.
# Session 38 call B: TILERT_GPU_SIDE_SH_AT=router no gain, removed with its part shat and its k3 / k4 lines;
# TILERT_GPU_IDX_QFUSE=1 slower on GLM-5, removed with its part iqf and its k4 / combo lines; TILERT_GPU_MLA_HEADS=16
# (mla_decode_wg2q) slower on GLM-5, removed with its half / k3 / k4 lines.
# Usage: bash docs/measured/next/s33.sh gpucheck|final|half|w12|k3|k4|combo|pdl|cap|qb|sweep|check1|check2
#  gpucheck (~5 min, first): gpu-check's correctness parts on today's main: kernels.OneRowExperts the default (session 31
#    call A ran only its kernel checks, TestGPUSideStreamSameTokens and TestGPUGreedyMatchesCPU on it), and
#    gemv_tile_fp8_r4_m2_d16 removed from the module.
#  final (~1 min): the README's rows (session 31 has only call A's A/B rows; GLM-5 at 131072 is session 30's).
#  cap (~1 min, env only): DeepSeek-V3.2's late q chain at 131072 capped at one block an SM instead of two, traced. At
#    131072 the efficiency is on the 70% line (69.9% / 70.3%, session 31 call A).
#  qb (~1.5 min, env only): DeepSeek-V3.2's q_b (24576x1536) and the indexer's wq_b (8192x1536) on other tile plans at
#    8192, 1 slot (G32: 3 chunks a thread of a 1536-byte row, none idle; G64 leaves half the threads a chunk short); and
#    wq_b at one block an SM (B1: session 31's trace has its 256 blocks of 128 registers fill every SM from 13.2 to 20.7
#    us, so q_b, DeepSeek-V3.2's critical chain at 8192, finds room only after them).
#  sweep (~2 min, env only): the routed experts' tile plans at 2 and 4 slots.
#  half (~4 min): TILERT_GPU_MLA_HEADS=32 (kernels.MLAHeadsPerBlock, mla_decode_wg2h: one-tile sparse MLA blocks of 32
#    heads, wg2b's bits; built in session 31 after its device time): checks, the kernel alone, A/B/A/B on both models at
#    8192 and 131072, traced. If it wins on a model twice, make it the default where it won (a rule in ops_mla_wg.go
#    wg2hKernel; session 38 did so for one row of 64 heads, wg2hAuto).
#  w12 (~2 min): TILERT_GPU_TOPK_W12=1 (kernels.TopKOneW12, topk_radix_one_w12: the one-block top-k of the 8448-key
#    bucket's rows at 12 keys a thread; built in session 31 after its device time, NOT RUN): TestKernelTopKOneW, then
#    A/B/A/B on both models at 8192, traced on GLM-5 (its top-k is on the critical path alone). If it wins twice on a
#    model and loses on neither, make it the default (kernels ops_topk.go).
#  pdl (~1 min, env only): programmatic or plain launches per family again at DeepSeek-V3.2 8192, 1 slot (session 16's sweep
#    found nothing, before the side streams' priorities and the uncapped q_b): the sparse MLA, whose early-resident
#    blocks each take a whole SM (168 registers x 384 threads, 226 KB) while absorb_q still runs; the top-k; the expert
#    GEMVs; the combine; the epilogue.
#  If cap wins twice at 131072 (A/B/A/B), give the late chain that cap (engine/gpu side.go sideOpen: q_chain_late_1row)
#  and say so; if a qb plan wins twice, pin it in the tile rule's table for that shape (kernels tile_plan.go).
# Suggested calls now (session 36; each part's results saved as it ends; the 30 minutes hold about the first three):
#   1 (cold): samp, then k4;   2 (warm): combo, then gpucheck (and final where a default changed);
#   3 (warm): what fits of half cap pdl qb sweep. Each loop as:
#   for p in k4; do bash docs/measured/next/s33.sh $p > $OUT/x-$p.log 2>&1; cat $OUT/summary-$p.txt; done
#   Read each call's A/B/A/B with `go run ./internal/abab FILES_AT/summary-*.txt` (here, not on the device).
#   Where two switches both win, A/B/A/B them together before either becomes a default, then gpucheck again.
NAME=s33; . docs/measured/next/plan.sh "$1"
case "$PART" in
wide)
  # ~3 min at LAYERS=3 (session 37; ran as its call A on an H100, docs/measured/h100-2026-12-05-s37): the many-block
  # sampler (kernels.SampleWide, the default since) against the one-block sample_rows: its checks (the two token for token on full rows, each against the float64
  # reference, the distributions, the scratch left zeroed), the timing table, the sampled engine checks, then the step
  # at 8192: greedy, sampled with the wide sampler, sampled with the one-block one, twice (DeepSeek-V3.2, then GLM-5).
  # LAYERS=3 on an 80 GB card.
  (export TILERT_GPU_TIMING=1; tst kernels cuda/kernels 300 'TestKernelSampling$|TestKernelTimingSample$'); cnt kernels
  grep -E "sample|argmax|mismatched|z-score" $R/kernels.log | head -90 >> $R/summary.txt
  S="--temperature 0.6 --top-p 0.95"
  for i in 1 2; do
    bn deepseek-v3.2 8192 1 wide-ds-G$i; SAMP="$S" bn deepseek-v3.2 8192 1 wide-ds-W$i; SAMP="$S" bn deepseek-v3.2 8192 1 wide-ds-O$i TILERT_GPU_SAMPLE_WIDE=0
  done
  tst engine engine/gpu 240 'TestGPUSampleCounterOnDevice|TestGPUSampledMTPIdentical|TestGPUPenaltiesMatchCPU|TestGPUAdjustRulesMatchCPU|TestGPUPipelineMatches|TestGPUGraph'; cnt engine; save
  for i in 1 2; do
    bn glm-5 8192 1 wide-glm-G$i; SAMP="$S" bn glm-5 8192 1 wide-glm-W$i; SAMP="$S" bn glm-5 8192 1 wide-glm-O$i TILERT_GPU_SAMPLE_WIDE=0
  done
  save ;;
samp)
  # ~4 min (session 36): the sampled pick against the greedy one. sample_rows (one block a row, up to eight radix
  # passes of shared-memory atomics over the 129280 logits) took 335 us in the first timings (cuda/kernels NOTES "v2
  # timings") where a greedy step pays argmax_wide; bench decode has measured greedy steps only. First the timing
  # table (argmax_wide and the sampler at four settings), then the step at 8192 on both models, greedy against
  # DeepSeek-V3.2's generation_config (temperature 0.6, top-p 0.95), A/B/A/B.
  (export TILERT_GPU_TIMING=1; tst kernels cuda/kernels 240 'TestKernelTiming$'); mv $R/kernels.log $R/kernels-timing.log
  grep -E "^(sample|argmax)" $R/kernels-timing.log | tee -a $R/summary.txt
  S="--temperature 0.6 --top-p 0.95"
  bn deepseek-v3.2 8192 1 samp-A; SAMP="$S" bn deepseek-v3.2 8192 1 samp-B
  bn deepseek-v3.2 8192 1 samp-A2; SAMP="$S" bn deepseek-v3.2 8192 1 samp-B2
  bn glm-5 8192 1 sampg-A; SAMP="$S" bn glm-5 8192 1 sampg-B
  bn glm-5 8192 1 sampg-A2; SAMP="$S" bn glm-5 8192 1 sampg-B2
  save ;;
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
qb)
  E=TILERT_GPU_TILE_PLANS
  bn deepseek-v3.2 8192 1 qb-A1
  for p in G32/R8_d16/B0 G32/R4_d16/B0 G32/R8_o4/B0 G64/R4_o4/B0 G128/R8_d16/B0; do bn deepseek-v3.2 8192 1 "qb-${p//\//_}" $E=24576x1536=$p; done
  for p in G32/R8_d16/B0 G32/R8_o4/B0 G64/R4_o4/B0 G64/R8_d16/B1; do bn deepseek-v3.2 8192 1 "wqb-${p//\//_}" $E=8192x1536=$p; done
  bn deepseek-v3.2 8192 1 qb-A2
  save ;;
half)
  tst kernels cuda/kernels 200 'TestKernelMLADecodeWG2H$|TestKernelMLADecodeWG2$'; cnt kernels; mv $R/kernels.log $R/kernels-wg.log
  (export TILERT_GPU_TIMING=1; tst kernels cuda/kernels 200 'TestKernelTimingMLADecodeWG2$'); mv $R/kernels.log $R/kernels-timing.log; cnt kernels-timing
  tst engine engine/gpu 300 'TestGPUMLADecodeWGHeads$|TestGPUMLADecodeWG$'; cnt engine; mv $R/engine.log $R/engine-wg.log
  (export TILERT_GPU_MLA_HEADS=32; tst engine engine/gpu 300 'TestGPUGreedyMatchesCPU$|TestGPUSideStreamSameTokens$'); mv $R/engine.log $R/engine-h32.log; cnt engine-h32
  abab deepseek-v3.2 8192 1 h32 TILERT_GPU_MLA_HEADS=32
  abab glm-5 8192 1 h32g TILERT_GPU_MLA_HEADS=32
  abab deepseek-v3.2 131072 1 h32l TILERT_GPU_MLA_HEADS=32
  abab glm-5 131072 1 h32gl TILERT_GPU_MLA_HEADS=32
  TL=1 bn deepseek-v3.2 8192 1 tl-h32 TILERT_GPU_MLA_HEADS=32
  TL=1 bn glm-5 8192 1 tl-h32g TILERT_GPU_MLA_HEADS=32
  xz -T4 $R/tl-*.json 2>/dev/null; save ;;
w12)
  tst kernels cuda/kernels 200 'TestKernelTopKOneW$'; cnt kernels
  abab glm-5 8192 1 w12g TILERT_GPU_TOPK_W12=1
  abab deepseek-v3.2 8192 1 w12 TILERT_GPU_TOPK_W12=1
  TL=1 bn glm-5 8192 1 tl-w12g TILERT_GPU_TOPK_W12=1
  xz -T4 $R/tl-*.json 2>/dev/null; save ;;
pdl)
  bn deepseek-v3.2 8192 1 pdl-A1
  bn deepseek-v3.2 8192 1 pdl-mla TILERT_GPU_PDL_MORE=mla_decode_tcf,gemv_mid,absorb_v,mla_decode_wg2h
  for f in topk_radix_one gemv_tile_fp8_r8_m1_o4 mla_combine attn_epilogue indexer_scores; do bn deepseek-v3.2 8192 1 pdl-$f TILERT_GPU_PDL_PLAIN=$f; done
  bn deepseek-v3.2 8192 1 pdl-A2
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
k3)
  # Session 33 call C (~8 min): half's and w12's checks and A/B/A/B at 8192.
  tst kernels cuda/kernels 200 'TestKernelMLADecodeWG2H$|TestKernelTopKOneW$'; cnt kernels
  (export TILERT_GPU_MLA_HEADS=32; tst engine engine/gpu 300 'TestGPUGreedyMatchesCPU$'); mv $R/engine.log $R/engine-h32.log; cnt engine-h32
  abab deepseek-v3.2 8192 1 h32 TILERT_GPU_MLA_HEADS=32
  abab glm-5 8192 1 h32g TILERT_GPU_MLA_HEADS=32
  abab glm-5 8192 1 w12g TILERT_GPU_TOPK_W12=1
  save ;;
k4)
  # Session 34 call B (~7 min): the tile GEMVs' checks after d81bc80 (their bodies back to session 31's text), k3, cap at
  # 131072, qb. (Session 38 ran it on an H100 with the fused wq_b alone too: slower, removed with its lines.)
  tst kernels cuda/kernels 200 'TestKernelMLADecodeWG2H$|TestKernelTopKOneW$|TestKernelGemvTile$|TestKernelTileVariantsBitwise$|TestKernelTilePlanBitwise$'; cnt kernels
  (export TILERT_GPU_MLA_HEADS=32; tst engine engine/gpu 300 'TestGPUGreedyMatchesCPU$'); mv $R/engine.log $R/engine-h32.log; cnt engine-h32
  tst engine engine/gpu 300 'TestGPUGreedyMatchesCPU$'; cnt engine
  abab glm-5 8192 1 w12g TILERT_GPU_TOPK_W12=1
  abab deepseek-v3.2 8192 1 h32 TILERT_GPU_MLA_HEADS=32
  abab glm-5 8192 1 h32g TILERT_GPU_MLA_HEADS=32
  abab deepseek-v3.2 8192 1 w12 TILERT_GPU_TOPK_W12=1
  abab deepseek-v3.2 131072 1 cap1 TILERT_GPU_SIDE_CAP=q=1
  E=TILERT_GPU_TILE_PLANS
  bn deepseek-v3.2 8192 1 qb-A1
  for p in G32/R8_d16/B0 G32/R8_o4/B0 G64/R4_o4/B0; do bn deepseek-v3.2 8192 1 "qb-${p//\//_}" $E=24576x1536=$p; done
  for p in G32/R8_d16/B0 G64/R8_d16/B1; do bn deepseek-v3.2 8192 1 "wqb-${p//\//_}" $E=8192x1536=$p; done
  bn deepseek-v3.2 8192 1 qb-A2
  save ;;
combo)
  # Session 35 (~4 min, env only): every opt-in not yet measured in the step, on together, against the defaults at 8192
  # and 131072 on both models: the most the queue can give in one reading. Run after k4; a switch that lost alone there
  # comes out of COMBO first (the router fold and the fused wq_b did, removed in session 38).
  COMBO="TILERT_GPU_MLA_HEADS=32 TILERT_GPU_TOPK_W12=1"
  abab deepseek-v3.2 8192 1 combo $COMBO
  abab glm-5 8192 1 combog $COMBO
  abab glm-5 131072 1 combog131 $COMBO
  abab deepseek-v3.2 131072 1 combo131 $COMBO
  save ;;
check1) check1 ;;
check2) check2 ;;
gpucheck) gpucheck ;;
final) rows ;;
*) echo "usage: s33.sh gpucheck|final|half|w12|k3|k4|combo|pdl|cap|qb|sweep|check1|check2" >&2; exit 2 ;;
esac
