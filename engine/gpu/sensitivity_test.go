package gpu

import (
	"slices"
	"testing"

	"github.com/tilert-go/tilert/cuda"
	"github.com/tilert-go/tilert/engine"
	"github.com/tilert-go/tilert/engine/internal/enginetest"
)

// noiseLevel is the relative size of float32 summation-order differences
// in sums of ~1000 products (sqrt(K) * 2^-24 ~ 2e-6): what two correct
// implementations, such as the GPU and the CPU, differ by in a GEMV output.
const noiseLevel = 1e-6

// noisyEmu is the emulator with every GEMV output nudged by a relative
// 1e-6 (deterministic): the size of the float32 summation-order
// differences between the GPU and the CPU.
type noisyEmu struct {
	*emuDevice
	n     uint64
	level float64 // 0: noiseLevel
}

func (m *noisyEmu) nudge(y cuda.DevPtr, N, M, ldy int) {
	level := m.level
	if level == 0 {
		level = noiseLevel
	}
	for r := 0; r < M; r++ {
		ys := m.f32(y.Add(int64(4*r*ldy)), N)
		for i := range ys {
			m.n = m.n*6364136223846793005 + 1442695040888963407
			ys[i] *= 1 + float32(int64(m.n>>40)-(1<<23))/(1<<23)*float32(level)
		}
	}
}

func (m *noisyEmu) gemvFP8(y, x, w, s cuda.DevPtr, N, K, M, ldx, ldy int) error {
	err := m.emuDevice.gemvFP8(y, x, w, s, N, K, M, ldx, ldy)
	m.nudge(y, N, M, ldy)
	return err
}

func (m *noisyEmu) gemvBF16(y, x, w cuda.DevPtr, N, K, M, ldx, ldy int) error {
	err := m.emuDevice.gemvBF16(y, x, w, N, K, M, ldx, ldy)
	m.nudge(y, N, M, ldy)
	return err
}

// The prefill GEMMs are nudged alike (they differ from the CPU by the same
// summation-order noise).
func (m *noisyEmu) gemmFP8(y, x, w, s cuda.DevPtr, N, K, M, ldx, ldy, parts int) error {
	err := m.emuDevice.gemmFP8(y, x, w, s, N, K, M, ldx, ldy, parts)
	m.nudge(y, N, M, ldy)
	return err
}

func (m *noisyEmu) gemmBF16(y, x, w cuda.DevPtr, N, K, M, ldx, ldy, parts int) error {
	err := m.emuDevice.gemmBF16(y, x, w, N, K, M, ldx, ldy, parts)
	m.nudge(y, N, M, ldy)
	return err
}

func (m *noisyEmu) gateUp(y, x, wg, sg, wu, su cuda.DevPtr, N, K, M, ldx, ldy int) error {
	err := m.emuDevice.gateUp(y, x, wg, sg, wu, su, N, K, M, ldx, ldy)
	m.nudge(y, N, M, ldy)
	return err
}

func (m *noisyEmu) experts(y, x cuda.DevPtr, ldx, xdiv, xsh int, t, ts [2]cuda.DevPtr, ids cuda.DevPtr, slots int, w, ws [2]cuda.DevPtr, dense, N, K int) error {
	err := m.emuDevice.experts(y, x, ldx, xdiv, xsh, t, ts, ids, slots, w, ws, dense, N, K)
	m.nudge(y, N, slots+dense, N)
	return err
}

// The grouped experts' GEMM too (every pair's row of its tiles).
func (m *noisyEmu) gemmExperts(y, x cuda.DevPtr, ldx, xRows int, wTable, sTable, tiles, xrows cuda.DevPtr, ntiles, nbig, N, K, parts int) error {
	err := m.emuDevice.gemmExperts(y, x, ldx, xRows, wTable, sTable, tiles, xrows, ntiles, nbig, N, K, parts)
	ts := m.i32(tiles, 3*ntiles)
	for t := 0; t < ntiles; t++ {
		if n := int(ts[3*t+2]); n > 0 {
			m.nudge(fptr(y, int(ts[3*t+1])*N), N, n, N)
		}
	}
	return err
}

type noisyRunner struct{ m *noisyEmu }

func (r *noisyRunner) run(f func(b device) error) error {
	return (&emuRunner{m: r.m.emuDevice}).runWith(r.m, f)
}
func (r *noisyRunner) runAhead(f func(b device) (bool, error)) error {
	return r.run(func(b device) error {
		_, err := f(b)
		return err
	})
}
func (r *noisyRunner) close() error { return nil }

// flipStats compares two teacher-forced runs: per-position relative logit
// errors (main positions, then MTP), how many exceed flipErr, and how many
// top-1 tokens differ.
type flipStats struct {
	errs     []float64
	nMain    int
	big, dis int
}

func compareRuns(al, am, bl, bm [][]float32) flipStats {
	var st flipStats
	for i := range al {
		st.errs = append(st.errs, relErr(bl[i], al[i]))
		if argmax(al[i]) != argmax(bl[i]) {
			st.dis++
		}
	}
	st.nMain = len(st.errs)
	for i := range am {
		st.errs = append(st.errs, relErr(bm[i], am[i]))
		if argmax(am[i]) != argmax(bm[i]) {
			st.dis++
		}
	}
	for _, e := range st.errs {
		if e > flipErr {
			st.big++
		}
	}
	return st
}

func (st flipStats) bigFrac() float64 { return float64(st.big) / float64(len(st.errs)) }
func (st flipStats) disFrac() float64 { return float64(st.dis) / float64(len(st.errs)) }

func (st flipStats) quantile(f float64) float64 {
	s := append([]float64(nil), st.errs...)
	slices.Sort(s)
	return s[min(len(s)-1, int(f*float64(len(s))))]
}

// noiseBaseline is how far the serving-mode forward of src moves when every
// GEMV output is nudged by noiseLevel: the emulator against itself. On the
// tiny random models such noise alone flips discrete decisions (fp8
// rounding of the indexer query and the caches, top-k and MoE near-ties) at
// many positions; a correct GPU forward cannot be expected to flip fewer.
func noiseBaseline(t *testing.T, src Source, toks []int, el, em [][]float32) flipStats {
	t.Helper()
	b, err := build(&noisyRunner{m: &noisyEmu{emuDevice: newEmu()}}, src, engine.Options{MaxSeqLen: maxSeq})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	bl, bm, err := b.TeacherForce(0, toks)
	if err != nil {
		t.Fatal(err)
	}
	return compareRuns(el, em, bl, bm)
}

// TestEmuNoiseSensitivity logs the baseline (CI: the numbers the GPU's
// logit check is judged against).
func TestEmuNoiseSensitivity(t *testing.T) {
	for _, pr := range enginetest.Presets {
		t.Run(pr, func(t *testing.T) {
			w, src := hfSourceOf(t, enginetest.PresetDir(t, pr))
			a := newTestEngine(t, onEmu, src, engine.Options{MaxSeqLen: maxSeq})
			toks := enginetest.Prompt(100, w.Config().VocabSize, 5)
			al, am, err := a.TeacherForce(0, toks)
			if err != nil {
				t.Fatal(err)
			}
			st := noiseBaseline(t, src, toks, al, am)
			t.Logf("%s, GEMV outputs nudged by %.0e: rel logit err p50 %.3g max %.3g; positions > %.0e: %d/%d; top-1 changed %d",
				pr, noiseLevel, st.quantile(0.5), st.quantile(1), flipErr, st.big, len(st.errs), st.dis)
			if st.quantile(0.5) == 0 {
				t.Error("the noise changed nothing: the wrapper is not in the path")
			}
		})
	}
}
