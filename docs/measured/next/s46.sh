# Session 46's device plan (issue 10). Usage: bash docs/measured/next/s46.sh v2|tx|ck|ah|pp   (binaries in .device/next)
# Session 45 found the pipelined step's copies outside its graphs by holding the bench's p50 against the traced busy
# time of one step (1 slot). This session asks the same of the steps that have not been traced that way: the MTP
# step (its verify picks go to the host before the MTP forward) and the 4-slot step.
#  v2 (~9 min, an H200: 9 MoE layers do not fit 80 GB): gpu-check's second half (decode.test, cuda.test, cupti.test),
#    the README's rows (both models, 8192 and 131072, 1 and 4 slots, MTP, a traced step of each), then tx.
#  tx (~1.5 min; LAYERS=3 on an H100): one traced MTP step and one traced 4-slot step, each after its own timed
#    steps: the bench's p50 against the trace's busy time is the time the step spends outside its graphs.
#  ck (~7 min): the engine's ^TestGPU (engine.test), session 45's refactors and the penalty test's logprobs-alone
#    case on a GPU for the first time.
#  ah (~3 min, an H200): session 45's copies A/B/A/B at 9 MoE layers (s45.sh ah).
#  pp (~7 min; LAYERS=3 on an H100; kernels.test, engine.test, tilert from .device/c5): TILERT_GPU_MTP_PAIRS=1, the MTP
#    forward over candidate pairs launched behind the verify's picks (engine/gpu pairs.go): mtp_pair_select's kernel
#    check, the engine checks it touches (pairs off and on), the MTP rows A/B/A/B against the default and a traced
#    MTP step with it.
#  pd (~1.5 min; tilert from .device/c6): the MTP and plain rows at 1 and 4 slots with the host's share and the graph
#    cache's runs per step (bench prints them under every GPU row), the pairs against the default.
#  hd (~6 min; engine.test, tilert from .device/c7): the MTP forward's head in one launch over its rows (headSpan):
#    the engine's ^TestGPU, then the MTP rows at 1 and 4 slots with the pairs A/B/A/B against it.
NAME=s46
. docs/measured/next/plan.sh "$1"
tx() {
  TL=1 MTP=1 bn deepseek-v3.2 8192 1 tl-mtp
  TL=1 bn deepseek-v3.2 8192 4 tl-ds4
  grep -h -E "timeline|idle " $R/tl-mtp.txt $R/tl-ds4.txt | head -16 >> $R/summary.txt
  xz -T4 $R/tl-*.json 2>/dev/null; save
}
case "$PART" in
v2) check2; rows; tx ;;
tx) tx ;;
ck) tst engine engine/gpu 400 '^TestGPU'; cnt engine; save ;;
pp)
  tst kernels cuda/kernels 200 '^TestKernelNormRopeElementwise$'; cnt kernels
  tst engine engine/gpu 300 '^TestGPU(MTPPairs|PipelineMatches)$'; cnt engine
  TILERT_GPU_MTP_PAIRS=1 tst engine engine/gpu 300 '^TestGPU(ForcedDrafts|SampledMTPIdentical|GreedyMatchesCPU|Trained|PipelineDrains|PenaltiesMatchCPU)$'
  cnt engine; save
  MTP=1 abab deepseek-v3.2 8192 1 pp8 TILERT_GPU_MTP_PAIRS=1
  MTP=1 abab glm-5 8192 1 ppg TILERT_GPU_MTP_PAIRS=1
  MTP=1 abab deepseek-v3.2 8192 4 pp4 TILERT_GPU_MTP_PAIRS=1
  TL=1 MTP=1 bn deepseek-v3.2 8192 1 tl-pp TILERT_GPU_MTP_PAIRS=1
  grep -h -E "timeline|idle " $R/tl-pp.txt | head -8 >> $R/summary.txt; xz -T4 $R/tl-*.json 2>/dev/null; save ;;
ah)
  abab deepseek-v3.2 8192 1 ah8 TILERT_GPU_AHEAD_COPY=0
  abab glm-5 131072 1 ahg TILERT_GPU_AHEAD_COPY=0 ;;
pd)
  # Where the 4-slot MTP step's time goes (pp: 7.95 ms by default, 6.51 with the pairs): the host's share and the
  # runs through the graph cache per step, printed under every GPU row since this part was added.
  bn deepseek-v3.2 8192 1,4 pd-plain
  MTP=1 bn deepseek-v3.2 8192 1,4 pd-mtp
  MTP=1 bn deepseek-v3.2 8192 1,4 pd-pairs TILERT_GPU_MTP_PAIRS=1
  grep -h -E "^ +8192|host per step" $R/pd-*.txt >> $R/summary.txt; save ;;
hd)
  # The MTP forward's head in one launch over its rows (forward.go headSpan): the engine's GPU checks, then the MTP
  # rows at 1 and 4 slots, the pairs A/B/A/B against the fixed default.
  tst engine engine/gpu 300 '^TestGPU'; cnt engine; save
  MTP=1 abab deepseek-v3.2 8192 4 hd4 TILERT_GPU_MTP_PAIRS=1
  MTP=1 abab deepseek-v3.2 8192 1 hd1 TILERT_GPU_MTP_PAIRS=1
  MTP=1 bn glm-5 8192 1,4 hdg
  grep -h -E "host per step" $R/hd4-A.txt $R/hd4-B.txt $R/hd1-A.txt $R/hd1-B.txt >> $R/summary.txt; save ;;
mp)
  # The MTP forward's meta from a pinned buffer (TILERT_GPU_MTP_META_PIN, ahead.go) against =0 (pageable, before).
  MTP=1 abab deepseek-v3.2 8192 1 mp1 TILERT_GPU_MTP_META_PIN=0
  grep -h -E "host per step" $R/mp1-A.txt $R/mp1-B.txt >> $R/summary.txt; save ;;
*) echo "usage: s46.sh v2|tx|ck|ah|pp|pd|hd|mp" >&2; exit 2 ;;
esac
