package gpu

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/tilert-go/tilert/cuda/kernels"
	"github.com/tilert-go/tilert/engine"
	"github.com/tilert-go/tilert/engine/internal/enginetest"
	"github.com/tilert-go/tilert/model"
	"github.com/tilert-go/tilert/model/synth"
)

// TILERT_GPU_QB_ABSORB=1 and 2 on the tiny presets: every one-row step's
// query chain on the side stream is one qbAbsorb in place of q_b's GEMV and
// absorbQ, steps of several rows keep the two, and the teacher-forced
// logits one row a forward are the two launches' bit for bit (the
// emulator runs the same two operations; the GPU's kernel keeps their
// bits, TestKernelQBAbsorb).
func TestEmuQBAbsorb(t *testing.T) {
	defer func(v string) { qbAbsorbMode = v }(qbAbsorbMode)
	for _, pr := range enginetest.Presets {
		t.Run(pr, func(t *testing.T) {
			c := newSwitchCasePast(t, pr)
			qbAbsorbMode = "0"
			off := c.run(t, onEmu, true)
			qbAbsorbMode = "1"
			on := c.run(t, onEmu, true)
			n := on.ops["qbAbsorb"]
			if off.ops["qbAbsorb"] != 0 {
				t.Fatalf("qbAbsorb launches with the switch off: %d", off.ops["qbAbsorb"])
			}
			if n == 0 {
				t.Skipf("%s: no one-row step ran the query's side chain", pr)
			}
			if d := off.ops["absorbQ"] - on.ops["absorbQ"]; d != n {
				t.Errorf("absorbQ: %d fewer launches on, want one a qbAbsorb (%d)", d, n)
			}
			if d := off.ops["gemvFP8"] - on.ops["gemvFP8"]; d != n {
				t.Errorf("gemvFP8: %d fewer launches on, want one a qbAbsorb (%d)", d, n)
			}
			w, src := hfSourceOf(t, enginetest.PresetDir(t, pr))
			checkQBAbsorbLogits(t, onEmu, src, enginetest.Prompt(48, w.Config().VocabSize, 9), pr, false)
		})
	}
}

// TestGPUQBAbsorb: DeepSeek-V3.2 and GLM-5 dims (the 2-layer presets,
// random weights) decode one row a forward with the query chain on
// qb_absorb, one block a head and a cluster of two, and the logits are the
// two launches' bit for bit.
func TestGPUQBAbsorb(t *testing.T) {
	gpuDevice(t)
	for _, name := range []string{"deepseek-v3.2-2layer", "glm-5 dims, 2 dense layers"} {
		var cfg *model.Config
		if name == "deepseek-v3.2-2layer" {
			cfg = synthConfig(t, name)
		} else {
			cfg = glm5DenseConfig(t)
		}
		r := rand.New(rand.NewPCG(60, 1))
		toks := make([]int, 40)
		for i := range toks {
			toks[i] = r.IntN(cfg.VocabSize)
		}
		// Auto takes DeepSeek-V3.2 dims' 128 heads on a card of 132 SMs.
		checkQBAbsorbLogits(t, onGPU, Dummy(cfg, 3), toks, name, cfg.NumHeads == 128)
	}
}

// glm5DenseConfig is deepseek-v3.2-2layer (two dense layers, no MTP) with
// GLM-5's attention and hidden dims (HF config: 64 heads, q_lora 2048,
// nope 192, v 256, 32 indexer heads, hidden 6144).
func glm5DenseConfig(t *testing.T) *model.Config {
	t.Helper()
	p, err := synth.Lookup("deepseek-v3.2-2layer")
	if err != nil {
		t.Fatal(err)
	}
	p.Name, p.Family = "glm-5-2dense", model.GLMMoEDSA
	p.VocabSize, p.HiddenSize, p.IntermediateSize = 154880, 6144, 12288
	p.NumHeads, p.QLoraRank, p.QKNopeHeadDim, p.VHeadDim, p.IndexNHeads = 64, 2048, 192, 256, 32
	p.NGroup, p.TopKGroup, p.Yarn = 1, 1, false
	p.MaxPositionEmbeddings, p.RMSNormEps, p.RopeTheta = 202752, 1e-5, 1e6
	b, err := synth.Build(p, 0)
	if err != nil {
		t.Fatal(err)
	}
	return b.Config
}

// checkQBAbsorbLogits teacher-forces toks one row a forward with the switch
// off, then at 1 and 2 blocks a head and auto, and asks for the same logits
// and MTP logits bit for bit; 1 and 2 must launch the kernel (the GPU's
// counted by kernels.QBAbsorbLaunches), off not, auto where wantAuto says.
func checkQBAbsorbLogits(t *testing.T, kind deviceKind, src Source, toks []int, name string, wantAuto bool) {
	t.Helper()
	defer func(v string) { qbAbsorbMode = v }(qbAbsorbMode)
	run := func(mode string) ([][]float32, [][]float32, int64) {
		qbAbsorbMode = mode
		e := newTestEngine(t, kind, src, engine.Options{MaxSeqLen: len(toks) + 16})
		e.m.chunkLen = 1
		n0 := kernels.QBAbsorbLaunches.Load()
		l, m, err := e.TeacherForce(0, toks)
		if err != nil {
			t.Fatalf("%+v", err)
		}
		return l, m, kernels.QBAbsorbLaunches.Load() - n0
	}
	ol, om, nOff := run("0")
	if kind == onGPU && nOff != 0 {
		t.Errorf("%s: %d qb_absorb launches with the switch off", name, nOff)
	}
	for _, mode := range []string{"1", "2", ""} {
		sl, sm, nOn := run(mode)
		if want := mode != "" || wantAuto; kind == onGPU && (nOn > 0) != want {
			t.Errorf("%s TILERT_GPU_QB_ABSORB=%q: %d qb_absorb launches (want some: %v)", name, mode, nOn, want)
		}
		tag := fmt.Sprintf("%s %s TILERT_GPU_QB_ABSORB=%s vs two launches, one row a forward", kind, name, mode)
		record(t, tag, "differing logits", float64(diffRows(ol, sl)+diffRows(om, sm)), 0)
	}
}

// diffRows counts the values of a and b whose bits differ (and rows or
// values one has and the other not).
func diffRows(a, b [][]float32) int {
	n := 0
	for i := range max(len(a), len(b)) {
		if i >= len(a) || i >= len(b) {
			n++
			continue
		}
		if len(a[i]) != len(b[i]) {
			n++
			continue
		}
		for j := range a[i] {
			if math.Float32bits(a[i][j]) != math.Float32bits(b[i][j]) {
				n++
			}
		}
	}
	return n
}
