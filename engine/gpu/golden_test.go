package gpu

import (
	"fmt"
	"math"
	"testing"

	"github.com/tilert-go/tilert/engine"
	"github.com/tilert-go/tilert/engine/internal/enginetest"
	"github.com/tilert-go/tilert/engine/internal/golden"
)

// HF transformers goldens (testdata/golden/<preset>.json, scripts/hf_golden.py),
// judged by the same rules as the CPU engine (engine/internal/golden): exact
// mode within golden.ExactMaxRelErr per step; serving mode by teacher-forced
// top-1 agreement, dense and indexer-sparse cases apart, cases HF itself
// marks ambiguous left out.

func TestEmuGolden(t *testing.T) { testGolden(t, onEmu) }
func TestGPUGolden(t *testing.T) { testGolden(t, onGPU) }

func testGolden(t *testing.T, kind deviceKind) {
	gs := enginetest.Goldens(t)
	if kind == onGPU {
		gpuDevice(t)
	}
	for _, g := range gs {
		t.Run(g.Preset, func(t *testing.T) {
			dir := enginetest.GoldenDir(t, g)
			_, src := hfSourceOf(t, dir)
			e := newTestEngine(t, kind, src, engine.Options{MaxSeqLen: 1024})
			var dense, sparse, mtpAll [2]int // agree, total
			var worst float64
			for _, c := range g.Cases {
				n := len(c.PromptIDs)
				toks := append(append([]int{}, c.PromptIDs...), c.GreedyIDs...)
				lg, mtp, err := e.TeacherForce(0, toks)
				if err != nil {
					t.Fatalf("%+v", err)
				}
				a := 0
				for s := range c.Logits {
					if argmax(lg[n-1+s]) == c.GreedyIDs[s] {
						a++
					}
					worst = math.Max(worst, golden.RelErr(lg[n-1+s], c.Logits[s]))
				}
				isDense := len(toks) <= e.Config().IndexTopK
				switch {
				case g.Ambiguous(c.Name) != "":
				case isDense:
					dense[0], dense[1] = dense[0]+a, dense[1]+len(c.Logits)
				default:
					sparse[0], sparse[1] = sparse[0]+a, sparse[1]+len(c.Logits)
				}
				for s := range c.MTPLogits {
					if n-1+s < len(mtp) {
						mtpAll[1]++
						if argmax(mtp[n-1+s]) == golden.Argmax(c.MTPLogits[s]) {
							mtpAll[0]++
						}
					}
				}
				t.Logf("case %s (%d tokens, dense %v, HF ambiguous %v): top-1 %d/%d", c.Name, len(toks), isDense, (g.Ambiguous(c.Name) != ""), a, len(c.Logits))
			}
			frac := func(x [2]int) float64 { return float64(x[0]) / float64(max(x[1], 1)) }
			t.Logf("%s serving top-1 agreement with HF: dense %d/%d, indexer-sparse %d/%d; MTP %d/%d; max rel logit err %.3g (not bounded)",
				kind, dense[0], dense[1], sparse[0], sparse[1], mtpAll[0], mtpAll[1], worst)
			name := fmt.Sprintf("%s %s HF golden top-1 (teacher-forced)", kind, g.Preset)
			if dense[1] > 0 {
				record(t, name+" dense", "fraction disagreeing", 1-frac(dense), 1-golden.ServingDenseMinFP8)
			}
			if sparse[1] > 0 {
				record(t, name+" indexer-sparse", "fraction disagreeing", 1-frac(sparse), 1-golden.ServingSparseMin)
			}
		})
	}
}

// Exact mode (float32 caches and indexer query) against the HF goldens with
// the CPU exact mode's criteria (engine/cpu TestGoldenExact): per step
// teacher-forced max|logit err|/max|logit| <= 1e-3, MTP logits the same,
// greedy continuation identical to HF's with and without MTP. Cases HF
// itself marks ambiguous are reported, not enforced, as on the CPU.
const exactRelBound = golden.ExactMaxRelErr

func TestEmuGoldenExact(t *testing.T) { testGoldenExact(t, onEmu) }
func TestGPUGoldenExact(t *testing.T) { testGoldenExact(t, onGPU) }

func testGoldenExact(t *testing.T, kind deviceKind) {
	gs := enginetest.Goldens(t)
	if kind == onGPU {
		gpuDevice(t)
	}
	for _, g := range gs {
		t.Run(g.Preset, func(t *testing.T) {
			dir := enginetest.GoldenDir(t, g)
			_, src := hfSourceOf(t, dir)
			e := newTestEngine(t, kind, src, engine.Options{Mode: engine.ModeExact, MaxSeqLen: 1024})
			em := newTestEngine(t, kind, src, engine.Options{Mode: engine.ModeExact, MTP: true, MaxSeqLen: 1024})
			for _, c := range g.Cases {
				n := len(c.PromptIDs)
				toks := append(append([]int{}, c.PromptIDs...), c.GreedyIDs...)
				lg, mtp, err := e.TeacherForce(0, toks)
				if err != nil {
					t.Fatalf("%+v", err)
				}
				var worst, worstM float64
				for s, want := range c.Logits {
					worst = math.Max(worst, golden.RelErr(lg[n-1+s], want))
				}
				for s, want := range c.MTPLogits {
					if n-1+s >= len(mtp) {
						worstM = math.Inf(1) // the last step has no MTP row: the golden asks for more than exists
						continue
					}
					worstM = math.Max(worstM, golden.RelErr(mtp[n-1+s], want))
				}
				got := enginetest.Generate(t, e, 0, c.PromptIDs, engine.Params{}, len(c.GreedyIDs))
				gotM := enginetest.Generate(t, em, 0, c.PromptIDs, engine.Params{}, len(c.GreedyIDs))
				mis := func(got []int) float64 {
					if i := enginetest.FirstDiff(got, c.GreedyIDs); i >= 0 {
						return float64(len(c.GreedyIDs) - i)
					}
					return 0
				}
				t.Logf("%s %s (prompt %d, %d steps): max rel logit err %.3g, MTP %.3g; greedy %v, with MTP %v",
					kind, c.Name, n, len(c.Logits), worst, worstM, got, gotM)
				name := fmt.Sprintf("%s %s exact vs HF golden, case %s", kind, g.Preset, c.Name)
				if g.Ambiguous(c.Name) != "" {
					t.Logf("%s: not enforced: HF itself is ambiguous here", name)
					continue
				}
				record(t, name+": logits (teacher-forced)", "max step max|d|/max|ref|", worst, exactRelBound)
				record(t, name+": MTP logits", "max step max|d|/max|ref|", worstM, exactRelBound)
				record(t, name+": greedy", "tokens after first mismatch", mis(got), 0)
				record(t, name+": greedy (MTP)", "tokens after first mismatch", mis(gotM), 0)
			}
			st := em.Stats()
			t.Logf("MTP acceptance on the golden continuations: %.2f (%d/%d)", st.AcceptRate(), st.AcceptedTokens, st.DraftTokens)
		})
	}
}
