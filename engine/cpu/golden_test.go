package cpu

import (
	"fmt"
	"math"
	"slices"
	"testing"

	"github.com/tilert-go/tilert/engine"
	"github.com/tilert-go/tilert/engine/internal/enginetest"
	"github.com/tilert-go/tilert/engine/internal/golden"
	"github.com/tilert-go/tilert/model"
)

// goldenModel loads the golden's checkpoint: a trained model's committed
// one (testdata/models), or the synthetic preset (its seed).
func goldenModel(t *testing.T, g *golden.File) loaded {
	key := fmt.Sprintf("%s@%d", g.Preset, g.Seed)
	if v, ok := loadedModels.Load(key); ok {
		return v.(loaded)
	}
	dir := enginetest.GoldenDir(t, g)
	cfg, err := model.LoadConfig(dir)
	if err != nil {
		t.Fatal(err)
	}
	w, err := model.OpenWeights(dir)
	if err != nil {
		t.Fatal(err)
	}
	// The weights are read into the engine at New, so the directory may go.
	return loaded{cfg: cfg, w: w}
}

func goldenEngine(t *testing.T, l loaded, o engine.Options) *Engine {
	o.MaxSeqLen = 1024
	e, err := New(l.cfg, l.w, o)
	if err != nil {
		t.Fatal(err)
	}
	return e
}

// TestGoldenExact checks exact mode against HF transformers: teacher-forced
// logits per step within 1e-3 of max|logit|, identical greedy continuation
// (with and without MTP), MTP logits within the same bound.
func TestGoldenExact(t *testing.T) {
	for _, g := range enginetest.Goldens(t) {
		t.Run(g.Preset, func(t *testing.T) {
			l := goldenModel(t, g)
			e := goldenEngine(t, l, engine.Options{Mode: engine.ModeExact})
			em := goldenEngine(t, l, engine.Options{Mode: engine.ModeExact, MTP: true})
			for _, c := range g.Cases {
				n := len(c.PromptIDs)
				toks := append(append([]int{}, c.PromptIDs...), c.GreedyIDs...)
				lg, mtp := teacherForce(t, e, toks)
				errorf := t.Errorf
				if why := g.Ambiguous(c.Name); why != "" {
					t.Logf("%s: not enforced: %s", c.Name, why)
					errorf = t.Logf
				}
				var worst, worstM float64
				for s, want := range c.Logits {
					err := golden.RelErr(lg[n-1+s], want)
					worst = math.Max(worst, err)
					if err > golden.ExactMaxRelErr {
						errorf("%s step %d: rel logit err %.3g > 1e-3", c.Name, s, err)
					}
				}
				for s, want := range c.MTPLogits {
					err := golden.RelErr(mtp[n-1+s], want)
					worstM = math.Max(worstM, err)
					if err > golden.ExactMaxRelErr {
						errorf("%s MTP step %d: rel logit err %.3g > 1e-3", c.Name, s, err)
					}
				}
				got := enginetest.Generate(t, e, 0, c.PromptIDs, engine.Params{}, len(c.GreedyIDs))
				if !slices.Equal(got, c.GreedyIDs) {
					errorf("%s greedy: got %v, want %v", c.Name, got, c.GreedyIDs)
				}
				gotM := enginetest.Generate(t, em, 0, c.PromptIDs, engine.Params{}, len(c.GreedyIDs))
				if !slices.Equal(gotM, c.GreedyIDs) {
					errorf("%s greedy with MTP: got %v, want %v", c.Name, gotM, c.GreedyIDs)
				}
				t.Logf("%s (prompt %d, %d steps): max rel logit err %.3g, MTP %.3g", c.Name, n, len(c.Logits), worst, worstM)
			}
			st := em.Stats()
			t.Logf("MTP acceptance on the golden continuations: %.2f (%d/%d)", st.AcceptRate(), st.AcceptedTokens, st.DraftTokens)
		})
	}
}

// TestGoldenServing reports serving mode's teacher-forced top-1 agreement
// with HF's greedy tokens (fp8_ds_mla and bf16 MLA caches, fp8 indexer).
func TestGoldenServing(t *testing.T) {
	for _, g := range enginetest.Goldens(t) {
		for _, dt := range []engine.CacheDType{engine.CacheFP8DSMLA, engine.CacheBF16} {
			t.Run(g.Preset+"/"+string(dt), func(t *testing.T) {
				l := goldenModel(t, g)
				e := goldenEngine(t, l, engine.Options{Mode: engine.ModeServing, MLACache: dt})
				var dense, sparse, mtpAll [2]int // agree, total
				var worst float64
				for _, c := range g.Cases {
					n := len(c.PromptIDs)
					toks := append(append([]int{}, c.PromptIDs...), c.GreedyIDs...)
					lg, mtp := teacherForce(t, e, toks)
					amb := g.Ambiguous(c.Name) != ""
					a := 0
					for s := range c.Logits {
						if engine.Argmax(lg[n-1+s]) == c.GreedyIDs[s] {
							a++
						}
						worst = math.Max(worst, golden.RelErr(lg[n-1+s], c.Logits[s]))
					}
					isDense := len(toks) <= l.cfg.IndexTopK
					switch {
					case amb:
					case isDense:
						dense[0], dense[1] = dense[0]+a, dense[1]+len(c.Logits)
					default:
						sparse[0], sparse[1] = sparse[0]+a, sparse[1]+len(c.Logits)
					}
					for s := range c.MTPLogits {
						mtpAll[1]++
						if engine.Argmax(mtp[n-1+s]) == golden.Argmax(c.MTPLogits[s]) {
							mtpAll[0]++
						}
					}
					t.Logf("case %s (%d tokens, dense %v): top-1 %d/%d (HF ambiguous: %v)", c.Name, len(toks), isDense, a, len(c.Logits), amb)
				}
				pct := func(x [2]int) float64 { return 100 * float64(x[0]) / float64(max(x[1], 1)) }
				t.Logf("serving (%s) top-1 agreement with HF: dense %d/%d = %.1f%%, indexer-sparse %d/%d = %.1f%%, all %d/%d = %.1f%%; MTP %d/%d; max rel logit err %.3g",
					dt, dense[0], dense[1], pct(dense), sparse[0], sparse[1], pct(sparse),
					dense[0]+sparse[0], dense[1]+sparse[1], pct([2]int{dense[0] + sparse[0], dense[1] + sparse[1]}),
					mtpAll[0], mtpAll[1], worst)
				denseMin := 100 * golden.ServingDenseMinBF16
				if dt == engine.CacheFP8DSMLA {
					denseMin = 100 * golden.ServingDenseMinFP8
				}
				if dense[1] > 0 && pct(dense) < denseMin {
					t.Errorf("dense top-1 agreement %.1f%% < %.0f%%", pct(dense), denseMin)
				}
				if sparseMin := 100 * golden.ServingSparseMin; sparse[1] > 0 && pct(sparse) < sparseMin {
					t.Errorf("indexer-sparse top-1 agreement %.1f%% < %.0f%%", pct(sparse), sparseMin)
				}
			})
		}
	}
}
