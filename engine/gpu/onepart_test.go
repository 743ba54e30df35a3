package gpu

import (
	"testing"

	"github.com/tilert-go/tilert/cuda"
	"github.com/tilert-go/tilert/cuda/kernels"
)

// The one-part prefill with every one-part switch on together
// (TILERT_GPU_GEMM=1 TILERT_GPU_GEMM_SPLITS=1 TILERT_GPU_MLA_PREFILL=4; the
// absorbs then run absorb_p1): each switch's own test derives its bounds
// for its own rounding (TestGPUPrefillGemmP1*: GEMMs and absorbs, with the
// MLA prefill pinned off; TestGPUMLAPrefillH1: mla_prefill_h1 with the
// GEMMs pinned to 3 parts), so the combination has its own check, with
// bounds derived for all its roundings at once:
//   - the GPU against the emulated one-part forward (the emulator
//     transcribes gemm_p1, absorb_p1 and mla_prefill_h1: the same
//     roundings): teacher-forced logits within TestGPULogitsMatchEmulator's
//     float32 bounds or p1NoiseFactor x what float32-sized noise
//     (noiseLevel on every GEMM, absorb and MLA output) does to the
//     emulated forward; caches value by value within p1NoiseFactor x that
//     noise's effect on them, or the floors (p1BeyondFloor, p1DifferFloor).
//     This is the check that fails on a kernel bug: a wrong row, head,
//     scale, tile or rounding moves most values of every layer past one
//     step (bugs planted in the emulator's transcriptions moved 33-42% of
//     the cache bytes, mla_prefill_test.go);
//   - the GPU against the CPU's float32 forward: within p1NoiseFactor x
//     what the emulated one-part forward itself moves from it (the
//     roundings' effect on the tiny random models, DESIGN's known traps),
//     or the single-switch baselines if larger; the first layer (no
//     attention upstream of its caches) within p1Layer0BeyondBound.

const onePartAllTag = " (all one-part: GEMMs, absorbs, MLA prefill h1)"

// withOnePartAll turns every one-part prefill switch on for one test.
func withOnePartAll(t *testing.T) {
	withP1(t)
	withMLAPrefillH1(t)
	oldTC, oldP1 := absorbTCOn, absorbP1On
	absorbTCOn, absorbP1On = false, true
	t.Cleanup(func() { absorbTCOn, absorbP1On = oldTC, oldP1 })
}

func TestGPUPrefillOnePartAll(t *testing.T) {
	gpuDevice(t)
	withOnePartAll(t)
	testCachesOnePart(t, onGPU, onePartAllTag)
	testLogitsOnePart(t, onGPU, onePartAllTag)
}

// TestEmuPrefillOnePartAll runs the combination's comparisons with the
// emulator as the engine under test (CI: it must run; the rows against the
// emulated forward are GPU-only). Its rows against the CPU would be judged
// by the single-switch nudge baseline, which the combination's roundings
// may exceed on the tiny random models: they are logged (recordP1), with
// the figures the GPU's bounds derive from.
func TestEmuPrefillOnePartAll(t *testing.T) {
	withOnePartAll(t)
	testCachesOnePart(t, onEmu, onePartAllTag)
	testLogitsOnePart(t, onEmu, onePartAllTag)
}

// recordP1 is record, except for the emulator with a combination (tag set):
// logged only (above).
func recordP1(t *testing.T, kind deviceKind, tag, name, metric string, value, bound float64) {
	t.Helper()
	if kind == onEmu && tag != "" {
		t.Logf("%s: %s = %.3g (single-switch bound %.3g: not enforced for the emulated combination)", name, metric, value, bound)
		return
	}
	record(t, name, metric, value, bound)
}

// TestAbsorbP1Routed pins where the one-part absorbs run: a forward with
// one part (serving-mode prefill, forwardParts), the GEMMs on, fp8 weights,
// >= gemmMinRows rows, R a multiple of 128; TILERT_GPU_ABSORB_P1=0 off.
func TestAbsorbP1Routed(t *testing.T) {
	oldG, oldP := gemmOn, absorbP1On
	t.Cleanup(func() { gemmOn, absorbP1On = oldG, oldP })
	for _, c := range []struct {
		gemm, on, fp8 bool
		parts, M, R   int
		want          bool
	}{
		{true, true, true, 1, 48, 512, true}, {true, true, true, 1, gemmMinRows, 512, true},
		{true, true, true, 3, 48, 512, false}, {true, true, true, 0, 48, 512, false}, {true, true, true, 2, 48, 512, false},
		{false, true, true, 1, 48, 512, false}, {true, false, true, 1, 48, 512, false}, {true, true, false, 1, 48, 512, false},
		{true, true, true, 1, gemmMinRows - 1, 512, false}, {true, true, true, 1, 48, 96, false},
	} {
		gemmOn, absorbP1On = c.gemm, c.on
		o := &ops{parts: c.parts}
		if got := o.absorbP1(c.fp8, c.M, c.R); got != c.want {
			t.Errorf("%+v: absorbP1 %v", c, got)
		}
	}
}

// The float32-sized noise on the one-part absorbs and the MLA prefill too
// (the GPU's summation order differs there as in the GEMMs).
func (m *noisyEmu) absorbQP1(out, qpe, q, w, s cuda.DevPtr, M, H, nope, R, ldq, hs, P int, rope kernels.QRope) error {
	err := m.emuDevice.absorbQP1(out, qpe, q, w, s, M, H, nope, R, ldq, hs, P, rope)
	m.nudge(out, R, M*H, R)
	return err
}

func (m *noisyEmu) absorbVP1(out, x, w, s cuda.DevPtr, M, H, vd, R, ldo int) error {
	err := m.emuDevice.absorbVP1(out, x, w, s, M, H, vd, R, ldo)
	m.nudge(out, H*vd, M, ldo)
	return err
}

func (m *noisyEmu) mlaPrefill(mode int, out, qn, qp, cache, indices, lens, ws cuda.DevPtr, nq, H, nidx, ldIdx int, scale float32) error {
	err := m.emuDevice.mlaPrefill(mode, out, qn, qp, cache, indices, lens, ws, nq, H, nidx, ldIdx, scale)
	m.nudge(out, H*kernels.MLALatentDim, nq, H*kernels.MLALatentDim)
	return err
}
