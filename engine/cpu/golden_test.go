package cpu

import (
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/tilert-go/tilert/engine"
	"github.com/tilert-go/tilert/model"
	"github.com/tilert-go/tilert/model/synth"
)

// golden is testdata/golden/<preset>.json as written by scripts/hf_golden.py
// (format in the team contract).
type golden struct {
	Preset   string            `json:"preset"`
	Seed     int64             `json:"seed"`
	Versions map[string]string `json:"versions"`
	Ref      struct {
		CheckpointSHA256 map[string]string `json:"checkpoint_sha256"`
	} `json:"reference"`
	Diagnostics []struct {
		Case string `json:"case"`
		TopK struct {
			ExactTies map[string]int `json:"exact_ties"`
		} `json:"topk"`
		Crosscheck struct {
			SingleForwardMaxRel float64 `json:"single_forward_max_rel"`
		} `json:"crosscheck"`
	} `json:"diagnostics"`
	Cases []struct {
		Name      string      `json:"name"`
		PromptIDs []int       `json:"prompt_ids"`
		GreedyIDs []int       `json:"greedy_ids"`
		Logits    [][]float64 `json:"logits"`
		MTPLogits [][]float64 `json:"mtp_logits"`
	} `json:"cases"`
}

// repoRoot walks up from the package directory to the directory with go.mod.
func repoRoot(t testing.TB) string {
	d, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	for {
		if _, err := os.Stat(filepath.Join(d, "go.mod")); err == nil {
			return d
		}
		p := filepath.Dir(d)
		if p == d {
			t.Fatal("go.mod not found above the test directory")
		}
		d = p
	}
}

func loadGoldens(t *testing.T) []*golden {
	files, _ := filepath.Glob(filepath.Join(repoRoot(t), "testdata", "golden", "*.json"))
	if len(files) == 0 {
		t.Skip("no testdata/golden/*.json yet: generate them with scripts/hf_golden.py on an H200 (see its header)")
	}
	var out []*golden
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		g := new(golden)
		if err := json.Unmarshal(data, g); err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		if g.Preset == "" || len(g.Cases) == 0 {
			t.Fatalf("%s: no preset or no cases", f)
		}
		out = append(out, g)
	}
	return out
}

// goldenModel writes the golden's preset checkpoint (its seed) into a temp dir.
func goldenModel(t *testing.T, g *golden) loaded {
	key := fmt.Sprintf("%s@%d", g.Preset, g.Seed)
	if v, ok := loadedModels.Load(key); ok {
		return v.(loaded)
	}
	dir := filepath.Join(t.TempDir(), g.Preset)
	if err := synth.Write(g.Preset, dir, g.Seed, nil); err != nil {
		t.Fatal(err)
	}
	cfg, err := model.LoadConfig(dir)
	if err != nil {
		t.Fatal(err)
	}
	w, err := model.OpenWeights(dir)
	if err != nil {
		t.Fatal(err)
	}
	for name, want := range g.Ref.CheckpointSHA256 {
		data, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			t.Fatal(err)
		}
		if got := fmt.Sprintf("%x", sha256.Sum256(data)); got != want {
			t.Fatalf("%s of preset %s seed %d has sha256 %s, the golden was made from %s: "+
				"regenerate testdata/golden/%s.json with scripts/hf_golden.py (model/synth output changed)",
				name, g.Preset, g.Seed, got, want, g.Preset)
		}
	}
	// The weights are read into the engine at New, so the directory may go.
	return loaded{cfg: cfg, w: w}
}

// ambiguous says why HF's own answer for a case is not reproducible: exact
// ties at the indexer's top-k boundary (torch.topk's tie order is
// unspecified; HF's single forward and per-step forwards then disagree).
func (g *golden) ambiguous(name string) string {
	for _, d := range g.Diagnostics {
		if d.Case != name {
			continue
		}
		if n := d.TopK.ExactTies["indexer"] + d.TopK.ExactTies["router"]; n > 0 || d.Crosscheck.SingleForwardMaxRel > 1e-3 {
			return fmt.Sprintf("HF itself is ambiguous here: %d exact top-k ties, its single forward and per-step forwards differ by %.3g",
				n, d.Crosscheck.SingleForwardMaxRel)
		}
	}
	return ""
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
	for _, g := range loadGoldens(t) {
		t.Run(g.Preset, func(t *testing.T) {
			l := goldenModel(t, g)
			e := goldenEngine(t, l, engine.Options{Mode: engine.ModeExact})
			em := goldenEngine(t, l, engine.Options{Mode: engine.ModeExact, MTP: true})
			for _, c := range g.Cases {
				n := len(c.PromptIDs)
				toks := append(append([]int{}, c.PromptIDs...), c.GreedyIDs...)
				lg, mtp := teacherForce(t, e, toks)
				errorf := t.Errorf
				if why := g.ambiguous(c.Name); why != "" {
					t.Logf("%s: not enforced: %s", c.Name, why)
					errorf = t.Logf
				}
				var worst, worstM float64
				for s, want := range c.Logits {
					err := relLogitErr(lg[n-1+s], want)
					worst = math.Max(worst, err)
					if err > 1e-3 {
						errorf("%s step %d: rel logit err %.3g > 1e-3", c.Name, s, err)
					}
				}
				for s, want := range c.MTPLogits {
					err := relLogitErr(mtp[n-1+s], want)
					worstM = math.Max(worstM, err)
					if err > 1e-3 {
						errorf("%s MTP step %d: rel logit err %.3g > 1e-3", c.Name, s, err)
					}
				}
				got := generate(t, e, 0, c.PromptIDs, engine.Params{}, len(c.GreedyIDs))
				if !slices.Equal(got, c.GreedyIDs) {
					errorf("%s greedy: got %v, want %v", c.Name, got, c.GreedyIDs)
				}
				gotM := generate(t, em, 0, c.PromptIDs, engine.Params{}, len(c.GreedyIDs))
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

// Serving-mode bounds on teacher-forced top-1 agreement with HF. Where every
// query attends densely (sequence <= index_topk) the only differences are the
// caches: 90% is required with the bf16 MLA cache; the fp8 one (3 mantissa
// bits) flips the smallest argmax margins of a random model (GLM short case:
// 17/20), so it must keep 80%. Where the indexer selects, its fp8
// keys and query (vLLM's layout) re-decide near-boundary positions: on random
// weights the score gaps at the top-k boundary are ~1e-5 relative (see the
// goldens' diagnostics), so selections flip far more than on a trained model
// (DESIGN, known traps). Those cases are reported, with a floor that still
// catches a broken serving path (a wrong layout agrees ~0%).
const (
	servingDenseMinBF16 = 90.0
	servingDenseMinFP8  = 80.0
	servingSparseMin    = 40.0
)

// TestGoldenServing reports serving mode's teacher-forced top-1 agreement
// with HF's greedy tokens (fp8_ds_mla and bf16 MLA caches, fp8 indexer).
func TestGoldenServing(t *testing.T) {
	for _, g := range loadGoldens(t) {
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
					amb := g.ambiguous(c.Name) != ""
					a := 0
					for s := range c.Logits {
						if engine.Argmax(lg[n-1+s]) == c.GreedyIDs[s] {
							a++
						}
						worst = math.Max(worst, relLogitErr(lg[n-1+s], c.Logits[s]))
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
						if engine.Argmax(mtp[n-1+s]) == argmax64(c.MTPLogits[s]) {
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
				denseMin := servingDenseMinBF16
				if dt == engine.CacheFP8DSMLA {
					denseMin = servingDenseMinFP8
				}
				if dense[1] > 0 && pct(dense) < denseMin {
					t.Errorf("dense top-1 agreement %.1f%% < %.0f%%", pct(dense), denseMin)
				}
				if sparse[1] > 0 && pct(sparse) < servingSparseMin {
					t.Errorf("indexer-sparse top-1 agreement %.1f%% < %.0f%%", pct(sparse), servingSparseMin)
				}
			})
		}
	}
}

func argmax64(x []float64) int {
	b := 0
	for i, v := range x {
		if v > x[b] {
			b = i
		}
	}
	return b
}
