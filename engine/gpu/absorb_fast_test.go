package gpu

import (
	"fmt"
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
	// Bits are compared: q_a's norm as its own launch (the switch off has
	// no absorb_q_fast to apply TILERT_GPU_QA_NORM=late's scale, so the
	// default's late form would compare two orders of rounding).
	defer func(v bool) { qaNormLate = v }(qaNormLate)
	qaNormLate = false
	for _, pr := range enginetest.Presets {
		t.Run(pr, func(t *testing.T) {
			c := newSwitchCase(t, pr)
			for _, mtp := range []bool{false, true} {
				absorbFastOn = false
				off := c.run(t, onGPU, mtp)
				absorbFastOn = true
				c.run(t, onGPU, mtp).sameAs(t, off, fmt.Sprintf("mtp=%v", mtp), "the switch off")
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
