package gpu

import (
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"testing"

	"github.com/tilert-go/tilert/engine"
	"github.com/tilert-go/tilert/model/synth"
)

// HF transformers goldens (testdata/golden/<preset>.json, scripts/hf_golden.py).
// The GPU engine runs serving mode (fp8 caches, fp8 indexer query), so the
// criterion is the CPU engine's serving one: teacher-forced top-1 agreement
// with HF's greedy tokens of at least 90%; the relative logit error is
// reported.

type golden struct {
	Preset string `json:"preset"`
	Seed   int64  `json:"seed"`
	Cases  []struct {
		Name      string      `json:"name"`
		PromptIDs []int       `json:"prompt_ids"`
		GreedyIDs []int       `json:"greedy_ids"`
		Logits    [][]float64 `json:"logits"`
		MTPLogits [][]float64 `json:"mtp_logits"`
	} `json:"cases"`
}

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
		t.Skip("no testdata/golden/*.json yet: generate them with scripts/hf_golden.py on an H200")
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

func relErr64(a []float32, b []float64) float64 {
	var num, den float64
	for i := range b {
		num = math.Max(num, math.Abs(float64(a[i])-b[i]))
		den = math.Max(den, math.Abs(b[i]))
	}
	return num / den
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

func TestEmuGolden(t *testing.T) { testGolden(t, onEmu) }
func TestGPUGolden(t *testing.T) { testGolden(t, onGPU) }

func testGolden(t *testing.T, kind backendKind) {
	gs := loadGoldens(t)
	if kind == onGPU {
		gpuDevice(t)
	}
	for _, g := range gs {
		t.Run(g.Preset, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), g.Preset)
			if err := synth.Write(g.Preset, dir, g.Seed, nil); err != nil {
				t.Fatal(err)
			}
			_, src := hfSourceOf(t, dir)
			e := newTestEngine(t, kind, src, engine.Options{MaxSeqLen: 1024})
			agree, total, agreeM, totalM := 0, 0, 0, 0
			var worst float64
			for _, c := range g.Cases {
				n := len(c.PromptIDs)
				toks := append(append([]int{}, c.PromptIDs...), c.GreedyIDs...)
				lg, mtp, err := e.TeacherForce(0, toks)
				if err != nil {
					t.Fatalf("%+v", err)
				}
				for s := range c.Logits {
					total++
					if argmax(lg[n-1+s]) == c.GreedyIDs[s] {
						agree++
					}
					worst = math.Max(worst, relErr64(lg[n-1+s], c.Logits[s]))
				}
				for s := range c.MTPLogits {
					if n-1+s < len(mtp) {
						totalM++
						if argmax(mtp[n-1+s]) == argmax64(c.MTPLogits[s]) {
							agreeM++
						}
					}
				}
			}
			t.Logf("%s serving top-1 agreement with HF: %d/%d; MTP %d/%d; max rel logit err %.3g", kind, agree, total, agreeM, totalM, worst)
			name := fmt.Sprintf("%s %s HF golden top-1 (teacher-forced)", kind, g.Preset)
			record(t, name, "fraction disagreeing", 1-float64(agree)/float64(total), 0.1)
			t.Logf("max rel logit err vs HF (serving mode, not bounded): %.3g", worst)
		})
	}
}
