# Session 56's device plan (issue 10). Usage: bash docs/measured/next/s56.sh a   (binaries in .device/next:
# tilert, kernels.test, engine.test)
#  a: on an H200, the four 1-slot target rows first (both models, 8192 and 131072, JSON; none taken on an
#     H200 since session 42), then q_b on the staged GEMV at 8192 (A/B/A/B, both models); on another card the
#     A/B/A/Bs at 8192, the checks the session-55 removals and the session-56 stageRows change touch, then 131072.
#     q_b is pinned by TILERT_GPU_TILE_PLANS (no new code): DeepSeek-V3.2 dims 24576 x 1536 in 64-row blocks (96 KB,
#     two an SM), GLM-5 dims 16384 x 2048 in 32-row blocks (64 KB; 64 rows would be 128 KB, one an SM).
NAME=s56
. docs/measured/next/plan.sh "$1"
DSQ=TILERT_GPU_TILE_PLANS=24576x1536=G32/R8_st/B0
GLQ=TILERT_GPU_TILE_PLANS=16384x2048=G32/R8_st/B0
qst8() {
  abab deepseek-v3.2 8192 1 qd8 $DSQ; abab glm-5 8192 1 qg8 $GLQ
  grep -h "TILERT_GPU_TILE_PLANS\|staged" $R/qd8-B.txt $R/qg8-B.txt | head -6 >> $R/summary.txt; save
}
qst131() { abab deepseek-v3.2 131072 1 qd131 $DSQ; abab glm-5 131072 1 qg131 $GLQ; }
checks() {
  export TILERT_GPU_REPORT=$R/report.txt TILERT_ENGINE_REPORT=$R/engine-report.txt
  tst kernels cuda/kernels 150 'TestKernelMLATCStaging|TestKernelGemm|TestKernelGemvStage|TestKernelAbsorb|TestPDL|TestKernelMLATCF' &
  tst engine engine/gpu 150 '^TestGPU(GreedyMatchesCPU|Prefill|FastPrefill|WqbStage)' & wait
  for f in kernels engine; do cnt $f; done; save
}
case "$PART" in
a)
  if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then
    JS=1 bn deepseek-v3.2 8192,131072 1 ds1
    JS=1 bn glm-5 8192,131072 1 glm1
    qst8
  else
    qst8; checks; qst131
  fi ;;
*) echo "usage: s56.sh a" >&2; exit 2 ;;
esac
