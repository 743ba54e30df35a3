package gpu

import (
	"fmt"
	"slices"
	"testing"

	"github.com/tilert-go/tilert/engine/internal/enginetest"
)

// scoresOp says whether a recorded call is the tensor-core indexer's scores
// launch (the histogram's writer, before the top-k), with the query
// prepared apart or in its prologue (qProOK).
func scoresOp(name string) bool { return name == "indexerScoresQ" || name == "indexerScoresQPro" }

// TILERT_GPU_IDX_QPRO (qProOK): in a one-row step the indexer query is
// prepared in the scores' prologue and the kv and indexer-key epilogue
// runs in q_a's norm launch. It must give what attnEpilogue's query blocks
// give: the same tokens and cache bytes, one slot past index_topk with and
// without MTP and two slots batched, with the q chain forked at q_a and
// after the scores (qOpen: GLM-5's q_b on the H200). The new runs must take
// it, and the indexer chain from the grouped input launch to the scores
// must be one launch shorter there: attnEpilogue (with the norm) and wq_b,
// against rmsnorm, wq_b and attnEpilogue.
func TestEmuIdxQProEqualOld(t *testing.T) { testIdxQPro(t, onEmu) }
func TestGPUIdxQProEqualOld(t *testing.T) { testIdxQPro(t, onGPU) }

func testIdxQPro(t *testing.T, kind deviceKind) {
	if kind == onGPU {
		gpuDevice(t)
	}
	defer func(on, qo bool) { idxQProOn, qOpenForce = on, qo }(idxQProOn, qOpenForce)
	for _, pr := range enginetest.Presets {
		t.Run(pr, func(t *testing.T) {
			c := newSwitchCasePast(t, pr)
			for _, qOpen := range []bool{false, true} {
				for _, mtp := range []bool{false, true} {
					qOpenForce = qOpen
					var r [2]switchRun
					for k, on := range []bool{false, true} {
						idxQProOn = on
						r[k] = c.run(t, kind, mtp)
					}
					name := fmt.Sprintf("mtp=%v qOpen=%v", mtp, qOpen)
					r[1].sameAs(t, r[0], name+" query in the scores' prologue", "attnEpilogue's query")
					if n := r[0].ops["indexerScoresQPro"]; n != 0 || r[1].ops["indexerScoresQPro"] == 0 {
						t.Errorf("%s: indexerScoresQPro launches %d with TILERT_GPU_IDX_QPRO=0, %d by default (want 0 and some)",
							name, n, r[1].ops["indexerScoresQPro"])
					}
					old, nw := idxChains(r[0].seqs), idxChains(r[1].seqs)
					pro := nw["indexerScoresQPro"]
					for _, ch := range pro {
						if want := []string{"attnEpilogue", "gemvFP8"}; !slices.Equal(ch, want) {
							t.Errorf("%s: launches from the grouped input launch to indexerScoresQPro %v, want %v", name, ch, want)
						}
					}
					// The same steps score; those at one row drop a launch.
					long := func(chs [][]string) (n int) {
						for _, ch := range chs {
							if slices.Equal(ch, []string{"rmsnorm", "gemvFP8", "attnEpilogue"}) {
								n++
							}
						}
						return n
					}
					oldQ, newQ := old["indexerScoresQ"], nw["indexerScoresQ"]
					if len(old["indexerScoresQPro"]) != 0 || len(oldQ) != len(newQ)+len(pro) || long(oldQ) != long(newQ)+len(pro) {
						t.Errorf("%s: indexer chains %d (%d of rmsnorm, wq_b, attnEpilogue) with TILERT_GPU_IDX_QPRO=0; by default %d, %d of them with the prologue, %d of the three",
							name, len(oldQ), long(oldQ), len(newQ)+len(pro), len(pro), long(newQ))
					}
					t.Logf("%s %s: %d scores launches with the query prologue; rmsnorm %d/%d attnEpilogue %d/%d (old/new)",
						kind, name, len(pro), r[0].ops["rmsnorm"], r[1].ops["rmsnorm"], r[0].ops["attnEpilogue"], r[1].ops["attnEpilogue"])
				}
			}
		})
	}
}

// idxChains returns, by the scores call that ends it, each indexer chain of
// the recorded runs: the main stream's calls after a grouped launch
// (gemvGroup) up to a scores call, side chains (fork to unfork) and the
// fork, unfork and join left out.
func idxChains(seqs [][]string) map[string][][]string {
	out := map[string][][]string{}
	for _, seq := range seqs {
		var cur []string
		in, side := false, false
		for _, n := range seq {
			switch {
			case n == "fork":
				side = true
			case n == "unfork" || n == "join":
				side = false
			case side:
			case n == "gemvGroup":
				cur, in = nil, true
			case scoresOp(n):
				if in {
					out[n] = append(out[n], cur)
				}
				in = false
			case in:
				cur = append(cur, n)
			}
		}
	}
	return out
}
