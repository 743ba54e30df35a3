package gpu

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/tilert-go/tilert/cuda/kernels"
	"github.com/tilert-go/tilert/engine"
	"github.com/tilert-go/tilert/engine/internal/enginetest"
)

// TILERT_GPU_OPROJ_SPLIT=1 on the tiny presets (the emulator takes their
// o_proj's 128 / 192 columns as slices of 16 / 48): every one-row step's
// o_proj is a split launch whose partials the post-attention norm's
// launch sums (an addRMSNorm becomes a moeCombineNorm), steps of several
// rows keep one GEMV, and the teacher-forced logits one row at a time move
// only by float32 summation order (the tiny models' near-ties bounded as
// the GPU-vs-CPU check bounds them).
func TestEmuOprojSplit(t *testing.T) {
	defer func(v string) { oSplitMode = v }(oSplitMode)
	for _, pr := range enginetest.Presets {
		t.Run(pr, func(t *testing.T) {
			c := newSwitchCasePast(t, pr)
			oSplitMode = "0"
			off := c.run(t, onEmu, true)
			oSplitMode = "1"
			on := c.run(t, onEmu, true)
			n := on.ops["gemvSplitK"]
			if n == 0 || off.ops["gemvSplitK"] != 0 {
				t.Fatalf("split launches: %d on, %d off (want some, none)", n, off.ops["gemvSplitK"])
			}
			if d := on.ops["moeCombineNorm"] - off.ops["moeCombineNorm"]; d != n {
				t.Errorf("moeCombineNorm: %d more launches on, want one a split (%d)", d, n)
			}
			if d := off.ops["addRMSNorm"] - on.ops["addRMSNorm"]; d != n {
				t.Errorf("addRMSNorm: %d fewer launches on, want one a split (%d)", d, n)
			}
			if d := off.ops["gemvFP8"] - on.ops["gemvFP8"]; d != n {
				t.Errorf("gemvFP8: %d fewer launches on, want one a split (%d)", d, n)
			}
			for i, run := range on.runs {
				// A run that split did so at every layer (one absorbV each).
				if run["gemvSplitK"] > 0 && run["gemvSplitK"] != run["absorbV"] {
					t.Errorf("graph run %d: %d splits, %d layers", i, run["gemvSplitK"], run["absorbV"])
				}
			}
			w, src := hfSourceOf(t, enginetest.PresetDir(t, pr))
			checkSplitLogits(t, onEmu, src, enginetest.Prompt(48, w.Config().VocabSize, 9), pr)
		})
	}
}

// TestGPUOprojSplit: DeepSeek-V3.2 dims (deepseek-v3.2-2layer, random
// weights) decode one row at a time with o_proj on the split kernel
// (gemv_tile_fp8_r8_m1_o4k: the GPU takes 8 slices of 2048 there), and the
// logits move only by float32 summation order against one GEMV.
func TestGPUOprojSplit(t *testing.T) {
	gpuDevice(t)
	cfg := synthConfig(t, "deepseek-v3.2-2layer")
	r := rand.New(rand.NewPCG(61, 1))
	toks := make([]int, 40)
	for i := range toks {
		toks[i] = r.IntN(cfg.VocabSize)
	}
	checkSplitLogits(t, onGPU, Dummy(cfg, 3), toks, "deepseek-v3.2-2layer")
}

// checkSplitLogits teacher-forces toks one row a forward with the split
// off, then on, and bounds the logits' difference; on must launch splits
// (the GPU's counted by kernels.SplitKLaunches), off none.
func checkSplitLogits(t *testing.T, kind deviceKind, src Source, toks []int, name string) {
	t.Helper()
	defer func(v string) { oSplitMode = v }(oSplitMode)
	run := func(mode string) ([][]float32, [][]float32, int64) {
		oSplitMode = mode
		e := newTestEngine(t, kind, src, engine.Options{MaxSeqLen: len(toks) + 16})
		e.m.chunkLen = 1
		n0 := kernels.SplitKLaunches.Load()
		l, m, err := e.TeacherForce(0, toks)
		if err != nil {
			t.Fatalf("%+v", err)
		}
		return l, m, kernels.SplitKLaunches.Load() - n0
	}
	ol, om, nOff := run("0")
	sl, sm, nOn := run("1")
	if kind == onGPU && (nOn == 0 || nOff != 0) {
		t.Errorf("split-K launches: %d on, %d off (want some, none)", nOn, nOff)
	}
	st := compareRuns(ol, om, sl, sm)
	tag := fmt.Sprintf("%s %s o_proj split-K vs one GEMV, one row a forward", kind, name)
	record(t, tag, "median max|d|/max|ref|", st.quantile(0.5), medianBound)
	record(t, tag, fmt.Sprintf("positions with err > %.0e", flipErr), st.bigFrac(), flipFraction)
}
