package gpu

import (
	"bytes"
	"testing"

	"github.com/tilert-go/tilert/cuda/kernels"
	"github.com/tilert-go/tilert/engine"
	"github.com/tilert-go/tilert/engine/internal/enginetest"
)

// TestGPUAbsorbFast: with TILERT_GPU_ABSORB_FAST=1 (set here, whatever the
// environment) greedy decoding == the CPU engine and the goldens hold, the
// tokens and cache bytes of one slot (with and without MTP) and of two
// batched slots equal the switch-off run's exactly (the one-row kernels
// compute absorb_q_fp8 / absorb_v_fp8's bits), and absorb_q_fast /
// absorb_v_fast actually ran.
func TestGPUAbsorbFast(t *testing.T) {
	gpuDevice(t)
	defer func(on bool) { absorbFastOn = on }(absorbFastOn)
	absorbFastOn = true
	n0 := kernels.AbsorbFastLaunches.Load()
	testGreedyCases(t, onGPU, engine.CacheFP8DSMLA, genCases, " absorb fast")
	testGolden(t, onGPU)
	if n := kernels.AbsorbFastLaunches.Load() - n0; n == 0 {
		t.Fatal("TILERT_GPU_ABSORB_FAST=1: no absorb_q_fast / absorb_v_fast launch ran")
	} else {
		t.Logf("TILERT_GPU_ABSORB_FAST=1: %d one-row absorb launches", n)
	}
	for _, pr := range enginetest.Presets {
		t.Run(pr, func(t *testing.T) {
			w, src := hfSourceOf(t, enginetest.PresetDir(t, pr))
			vocab := w.Config().VocabSize
			n := 12
			prompt := enginetest.Prompt(min(40, w.Config().IndexTopK-n-4), vocab, 7)
			for _, mtp := range []bool{false, true} {
				var toks [2][]int
				var caches [2][]byte
				var batch [2][][]int
				for k, on := range []bool{false, true} {
					absorbFastOn = on
					e := newTestEngine(t, onGPU, src, engine.Options{MTP: mtp, MaxSeqLen: len(prompt) + n + 16, Slots: 2})
					toks[k] = enginetest.GenerateKeep(t, e, 0, prompt, engine.Params{}, n)
					caches[k] = exportBytes(t, e, 0)
					e.Release(0)
					batch[k] = generateBatch(t, e, [][]int{prompt[:len(prompt)/2], prompt}, engine.Params{}, n)
				}
				if i := enginetest.FirstDiff(toks[1], toks[0]); i >= 0 {
					t.Errorf("mtp=%v: tokens differ from the switch off at %d:\n got %v\nwant %v", mtp, i, toks[1], toks[0])
				}
				if !bytes.Equal(caches[1], caches[0]) {
					t.Errorf("mtp=%v: caches differ from the switch off", mtp)
				}
				for s := range batch[0] {
					if i := enginetest.FirstDiff(batch[1][s], batch[0][s]); i >= 0 {
						t.Errorf("mtp=%v batched slot %d: tokens differ from the switch off at %d", mtp, s, i)
					}
				}
			}
		})
	}
}

// TILERT_GPU_ABSORB_FAST_RW's parse: only the rows a warp absorb_v_fast
// has a kernel for; anything else is the rule (0).
func TestAbsorbFastRW(t *testing.T) {
	for v, want := range map[string]int{"": 0, "1": 1, "2": 2, "4": 4, "8": 8, "3": 0, "16": 0, "x": 0, "0": 0} {
		if got := absorbRW(v); got != want {
			t.Errorf("absorbRW(%q) = %d, want %d", v, got, want)
		}
	}
}
