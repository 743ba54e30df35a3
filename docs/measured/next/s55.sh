# Session 55's device plan (issue 10). Usage: bash docs/measured/next/s55.sh h|q|k   (binaries in .device/next)
#  h (tilert; decode.test, cuda.test, cupti.test): on an H200, s53.sh h5 (every README row and traced steps, then the
#    staged wq_b's A/B/A/Bs); on an H100, q below.
#  q (tilert): q_b on the staged GEMV (gemv_stage_fp8_r8_m1, the tile plan variant _st that wq_b runs by default
#    since session 53), pinned by TILERT_GPU_TILE_PLANS with no new code: A/B/A/B, 1 slot, both models, 8192 and
#    131072. Session 53 found the staged wq_b gaining from its blocks' one burst of loads beside q_b, not from the
#    overlap before its PDL wait; q_b (37.7 MB on DeepSeek-V3.2 dims, 33.6 on GLM-5 dims) streams beside the
#    indexer chain at ~1.5-1.9 TB/s.
#  k (kernels.test, engine.test): make gpu-check's first half after the fp16-part GEMMs' and mla_decode_tc32's removal
#    (session 55).
#  qk (tilert, kernels.test, engine.test): q, then the checks those removals touched (the kernels' GEMM, absorb, MLA
#    staging, staged GEMV and PDL tests; the engine's greedy == CPU and prefill checks), for a short budget.
#    Since session 56 GLM-5 dims' q_b stages 32-row blocks (two an SM), not 64 (kernels.stageRows).
NAME=s55
. docs/measured/next/plan.sh "$1"
DSQ=TILERT_GPU_TILE_PLANS=24576x1536=G32/R8_st/B0
GLQ=TILERT_GPU_TILE_PLANS=16384x2048=G32/R8_st/B0
# qst8 / qst131: the A/B/A/Bs at one context, both models
qst8() {
  abab deepseek-v3.2 8192 1 qd8 $DSQ; abab glm-5 8192 1 qg8 $GLQ
  grep -h "TILERT_GPU_TILE_PLANS\|staged" $R/qd8-B.txt $R/qg8-B.txt | head -6 >> $R/summary.txt; save
}
qst131() { abab deepseek-v3.2 131072 1 qd131 $DSQ; abab glm-5 131072 1 qg131 $GLQ; }
case "$PART" in
h)
  if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then
    timeout ${H5S:-330} bash docs/measured/next/s53.sh h5 > $R/s53-h5.log 2>&1; echo "s53 h5 rc=$?" >> $R/summary.txt
    cp $OUT/summary-h5.txt $R/s53-summary-h5.txt 2>/dev/null; cat $R/s53-summary-h5.txt >> $R/summary.txt; save
  fi
  qst8; qst131 ;;
q) qst8; qst131 ;;
k) check1 ;;
qk)
  # a short budget's order: the 8192 A/B/A/Bs, the checks, then 131072's
  qst8
  export TILERT_GPU_REPORT=$R/report.txt TILERT_ENGINE_REPORT=$R/engine-report.txt
  tst kernels cuda/kernels 150 'TestKernelMLATCStaging|TestKernelGemm|TestKernelGemvStage|TestKernelAbsorb|TestPDL|TestKernelMLATCF' &
  tst engine engine/gpu 150 '^TestGPU(GreedyMatchesCPU|Prefill|FastPrefill)' & wait
  for f in kernels engine; do cnt $f; done; save
  qst131 ;;
*) echo "usage: s55.sh h|q|k|qk" >&2; exit 2 ;;
esac
