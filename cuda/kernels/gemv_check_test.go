package kernels

// What the GEMV checks share (gemv_fp8/bf16, their wide and tile forms, the
// routed experts, the tensor-core GEMMs): random fp8 weights with block
// scales, the input rows, one launch into poisoned outputs and the record
// against the float64 reference.

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/tilert-go/tilert/cuda"
)

// randScales returns n block scales in [2^exp/2, 2^exp*3/2).
func randScales(r *rand.Rand, n int, exp int) []float32 {
	sc := make([]float32, n)
	for i := range sc {
		sc[i] = float32(math.Ldexp(0.5+r.Float64(), exp))
	}
	return sc
}

// fp8At is the float64 value of fp8 weight [n][k] of a [N][K] matrix with
// 128x128 block scales.
func fp8At(w []byte, sc []float32, K int) func(n, k int) float64 {
	kb := cdiv(K, 128)
	return func(n, kk int) float64 { return fp8Table[w[n*K+kk]] * float64(sc[(n/128)*kb+kk/128]) }
}

// diffCount counts outputs that differ bit for bit.
func diffCount(a, b []float32) int {
	n := 0
	for i := range a {
		if math.Float32bits(a[i]) != math.Float32bits(b[i]) {
			n++
		}
	}
	return n + len(b) - len(a)
}

// gemvCase is one GEMV check: N outputs of K inputs for M rows of x (row
// stride K+pad), plus a random residual when resid.
type gemvCase struct {
	N, K, M, pad int
	resid        bool
}

// dims names the case in check rows.
func (cs gemvCase) dims() string {
	return fmt.Sprintf("N=%d K=%d M=%d ldx=%d", cs.N, cs.K, cs.M, cs.K+cs.pad)
}

// The launchers' signatures (Set methods).
type (
	gemvFP8Func     func(s cuda.Stream, y, x, w, scale, resid cuda.DevPtr, N, K, M, ldx, ldy int) error
	gemvBF16Func    func(s cuda.Stream, y, x, w, resid cuda.DevPtr, N, K, M, ldx, ldy int) error
	gemvExpertsFunc func(s cuda.Stream, y, x cuda.DevPtr, xstride int, wTable, sTable, ids cuda.DevPtr, slots, N, K int) error
)

// gemvRows draws cs's input rows and, with cs.resid, its residual (rp is
// the uploaded residual, 0 without one).
func gemvRows(r *rand.Rand, a *allocs, cs gemvCase) (x, resid []float32, rp cuda.DevPtr) {
	x = randF32(r, cs.M*(cs.K+cs.pad), 1)
	if cs.resid {
		resid = randF32(r, cs.M*cs.N, 1)
		rp = a.up(resid)
	}
	return x, resid, rp
}

// checkGemvFP8 checks gemv on random fp8 weights (block scales ~2^-8) and
// rows for cs against the float64 reference, as check row name; with
// repeat, a second run into fresh outputs must agree bit for bit (row
// name+" repeat").
func checkGemvFP8(t *testing.T, c *cuda.Ctx, a *allocs, r *rand.Rand, gemv gemvFP8Func, cs gemvCase, name string, repeat bool) {
	N, K, M := cs.N, cs.K, cs.M
	ldx := K + cs.pad
	w := randFP8(r, N*K)
	sc := randScales(r, cdiv(N, 128)*cdiv(K, 128), -8)
	x, resid, rp := gemvRows(r, a, cs)
	xp, wp, sp := a.up(x), a.up(w), a.up(sc)
	runs := make([][]float32, 1, 2)
	if repeat {
		runs = runs[:2]
	}
	for i := range runs {
		yp := a.poisoned(M * N)
		chk(gemv(c.Stream(), yp, xp, wp, sp, rp, N, K, M, ldx, N))
		runs[i] = downF32(c, yp, M*N)
	}
	ref := refGemv(fp8At(w, sc, K), x, resid, N, K, M, ldx, N)
	record(t, name, relMetric, relErr(runs[0], ref), boundF32)
	if repeat {
		record(t, name+" repeat", "differing outputs", float64(diffCount(runs[0], runs[1])), 0)
	}
}

// checkGemvBF16 checks gemv on random bf16 weights and rows for cs against
// the float64 reference, as check row name.
func checkGemvBF16(t *testing.T, c *cuda.Ctx, a *allocs, r *rand.Rand, gemv gemvBF16Func, cs gemvCase, name string) {
	N, K, M := cs.N, cs.K, cs.M
	ldx := K + cs.pad
	w := randBF16(r, N*K, 0.05)
	x, resid, rp := gemvRows(r, a, cs)
	yp := a.poisoned(M * N)
	chk(gemv(c.Stream(), yp, a.up(x), a.up(w), rp, N, K, M, ldx, N))
	ref := refGemv(func(n, kk int) float64 { return bf16ToF64(w[n*K+kk]) }, x, resid, N, K, M, ldx, N)
	record(t, name, relMetric, relErr(downF32(c, yp, M*N), ref), boundF32)
}

// fp8Experts is E random fp8 weights [N][K] with block scales (~2^-7), on
// the host (w, sc) and on the device (wp, sp).
type fp8Experts struct {
	K      int
	w      [][]byte
	sc     [][]float32
	wp, sp []cuda.DevPtr
}

func randFP8Experts(r *rand.Rand, a *allocs, E, N, K int) fp8Experts {
	ex := fp8Experts{K: K, w: make([][]byte, E), sc: make([][]float32, E), wp: make([]cuda.DevPtr, E), sp: make([]cuda.DevPtr, E)}
	for e := range E {
		ex.w[e] = randFP8(r, N*K)
		ex.sc[e] = randScales(r, cdiv(N, 128)*cdiv(K, 128), -7)
		ex.wp[e], ex.sp[e] = a.up(ex.w[e]), a.up(ex.sc[e])
	}
	return ex
}

// at is expert e's weights for refGemv.
func (ex fp8Experts) at(e int) func(n, k int) float64 { return fp8At(ex.w[e], ex.sc[e], ex.K) }

// checkGemvExperts checks gemv (routed experts through device pointer
// tables) for experts ids on rows of x (row j at j*xstride; 0: one row for
// all) against the float64 reference, as check row name.
func checkGemvExperts(t *testing.T, c *cuda.Ctx, a *allocs, gemv gemvExpertsFunc, ex fp8Experts, ids []int32, x []float32, xstride, N int, name string) {
	K, slots := ex.K, len(ids)
	yp := a.poisoned(slots * N)
	chk(gemv(c.Stream(), yp, a.up(x), xstride, a.up(ex.wp), a.up(ex.sp), a.up(ids), slots, N, K))
	ref := make([]float64, slots*N)
	for j, e := range ids {
		copy(ref[j*N:], refGemv(ex.at(int(e)), x[j*xstride:], nil, N, K, 1, K, N))
	}
	record(t, name, relMetric, relErr(downF32(c, yp, slots*N), ref), boundF32)
}
