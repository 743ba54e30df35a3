# Session 39's device plan (issue 10). Usage: bash docs/measured/next/s39.sh rows|hf|embed   (binaries of main in .device/next)
#  embed (~2 min, NOT RUN): TILERT_GPU_EMBED_VEC=1 (kernels.EmbedVec: the embedding row's loads before its stores; built
#    after session 39's device time): its kernel checks, the engine's greedy cases with it on, then A/B/A/B on both
#    models at 8192, 1 slot. If it wins twice on both, make it the default (cuda/kernels ops.go EmbedVec) and keep
#    only the _v kernels' text under the old names.
#  rows (~4 min on an H200): the README's rows on today's defaults (9 MoE layers; plan.sh takes 3 on a card under
#    100 GB), sampled rows beside them, and session 38's two attention defaults against both off on GLM-5.
#    Session 38's checks of those defaults ran in session 39 call A (s38.sh final: kernels 23, engine 16 PASS).
#  hf (~5 min): scripts/hf_bench.py on the deepseek-v3.2-moe checkpoint (HF transformers' fastest setting against tilert,
#    prefill included), then tilert's fast prefill; the README's HF table is session 27's (6.04x / 6.09x, on the line).
NAME=s39; . docs/measured/next/plan.sh "$1"
case "$PART" in
rows)
  rows
  SAMP="--temperature 0.6 --top-p 0.95" bn deepseek-v3.2 8192,131072 1 ds-samp
  SAMP="--temperature 0.6 --top-p 0.95" bn glm-5 8192,131072 1 glm-samp
  abab glm-5 8192 1 newg TILERT_GPU_TOPK_W12=0 TILERT_GPU_MLA_HEADS=64
  save ;;
hf)
  PYTHONUNBUFFERED=1 timeout 330 python3 scripts/hf_bench.py --tilert $D/tilert --preset deepseek-v3.2-moe \
      --model-dir /tmp/ds-moe --contexts 1024,8192 --tokens 32 --json $R/hf-bench.json > $R/hf-bench.log 2>&1
  echo "rc=$?" >> $R/hf-bench.log; save
  PYTHONUNBUFFERED=1 timeout 120 python3 scripts/hf_bench.py --tilert $D/tilert --model-dir /tmp/ds-moe \
      --contexts 1024,8192 --tokens 8 --skip-hf --no-context-bench --prefill-precision fast \
      --json $R/hf-fast.json > $R/hf-fast.log 2>&1
  echo "rc=$?" >> $R/hf-fast.log
  grep -E "^ +[0-9]+ |fastest|precision|rc=" $R/hf-bench.log $R/hf-fast.log >> $R/summary.txt; save ;;
embed)
  tst kernels cuda/kernels 120 'TestKernelNormRopeElementwise$'; cnt kernels
  tst engine engine/gpu 200 'TestGPUEmbedVec$'; cnt engine
  abab deepseek-v3.2 8192 1 emb TILERT_GPU_EMBED_VEC=1
  abab glm-5 8192 1 embg TILERT_GPU_EMBED_VEC=1
  TL=1 bn glm-5 8192 1 tl-emb TILERT_GPU_EMBED_VEC=1
  save ;;
*) echo "usage: s39.sh rows|hf|embed" >&2; exit 2 ;;
esac
