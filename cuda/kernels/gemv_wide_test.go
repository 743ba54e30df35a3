package kernels

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/tilert-go/tilert/cuda"
)

// TestKernelGemvWide checks the wide fp8 and bf16 GEMVs against the float64
// reference on fresh random inputs, for every rows-per-block variant (0:
// the launcher's choice by shape), including shapes that fall back to
// the warp-per-row kernels (K not whole 16-byte chunks), a padded x (ldx > K), and that two runs agree bit
// for bit (the fixed-order combine).
func TestKernelGemvWide(t *testing.T) {
	for _, rows := range []int{0, 1, 2, 4, 8} {
		t.Run(fmt.Sprintf("rows_per_block=%d", rows), func(t *testing.T) {
			forceGemvWideRows = rows
			defer func() { forceGemvWideRows = 0 }()
			testGemvWide(t, fmt.Sprintf(" R=%d", rows))
		})
	}
}

func randScales(r *rand.Rand, n int, exp int) []float32 {
	sc := make([]float32, n)
	for i := range sc {
		sc[i] = float32(math.Ldexp(0.5+r.Float64(), exp))
	}
	return sc
}

func testGemvWide(t *testing.T, tag string) {
	onGPU(t, func(c *cuda.Ctx, k *Set, a *allocs, r *rand.Rand) {
		s := c.Stream()
		type tc struct {
			N, K, M, pad int
			resid        bool
		}
		cases := []tc{
			{576, 7168, 1, 0, false}, {256, 7168, 4, 0, true}, {130, 2112, 3, 0, false},
			{1536, 1536, 2, 0, true}, {37, 400, 1, 16, false}, {9, 16, 4, 0, true},
			{300, 2048, 1, 0, true}, {129, 16384, 2, 0, false},
			{50, 100, 2, 0, true}, // K % 16 != 0: falls back to gemv_fp8
		}
		for _, cs := range cases {
			N, K, M := cs.N, cs.K, cs.M
			ldx := K + cs.pad
			w := randFP8(r, N*K)
			kb := cdiv(K, 128)
			sc := randScales(r, cdiv(N, 128)*kb, -8)
			x := randF32(r, M*ldx, 1)
			var resid []float32
			rp := cuda.DevPtr(0)
			if cs.resid {
				resid = randF32(r, M*N, 1)
				rp = a.up(resid)
			}
			xp, wp, sp := a.up(x), a.up(w), a.up(sc)
			var runs [2][]float32
			for i := range runs {
				yp := a.poisoned(M * N)
				chk(k.GemvFP8Wide(s, yp, xp, wp, sp, rp, N, K, M, ldx, N))
				runs[i] = downF32(c, yp, M*N)
			}
			ref := refGemv(func(n, kk int) float64 { return fp8Table[w[n*K+kk]] * float64(sc[(n/128)*kb+kk/128]) }, x, resid, N, K, M, ldx, N)
			name := fmt.Sprintf("gemv_fp8_wide N=%d K=%d M=%d ldx=%d", N, K, M, ldx) + tag
			record(t, name, relMetric, relErr(runs[0], ref), boundF32)
			record(t, name+" repeat", "differing outputs", float64(diffCount(runs[0], runs[1])), 0)
		}
		for _, cs := range []tc{{256, 7168, 1, 0, false}, {64, 7168, 4, 8, true}, {129, 200, 2, 0, true}, {50, 37, 2, 0, false}} {
			N, K, M := cs.N, cs.K, cs.M
			ldx := K + cs.pad
			w := randBF16(r, N*K, 0.05)
			x := randF32(r, M*ldx, 1)
			var resid []float32
			rp := cuda.DevPtr(0)
			if cs.resid {
				resid = randF32(r, M*N, 1)
				rp = a.up(resid)
			}
			yp := a.poisoned(M * N)
			chk(k.GemvBF16Wide(s, yp, a.up(x), a.up(w), rp, N, K, M, ldx, N))
			ref := refGemv(func(n, kk int) float64 { return bf16ToF64(w[n*K+kk]) }, x, resid, N, K, M, ldx, N)
			record(t, fmt.Sprintf("gemv_bf16_wide N=%d K=%d M=%d ldx=%d", N, K, M, ldx)+tag, relMetric, relErr(downF32(c, yp, M*N), ref), boundF32)
		}
		// Routed experts through device pointer tables.
		for _, ec := range []struct {
			E, slots, N, K int
			shared         bool
		}{{6, 4, 200, 384, true}, {6, 4, 200, 384, false}, {16, 8, 256, 7168, true}, {9, 3, 130, 2048, false}, {4, 2, 64, 100, true}} {
			E, slots, N, K := ec.E, ec.slots, ec.N, ec.K
			kb := cdiv(K, 128)
			ws := make([][]byte, E)
			ss := make([][]float32, E)
			wt := make([]cuda.DevPtr, E)
			st := make([]cuda.DevPtr, E)
			for e := range E {
				ws[e] = randFP8(r, N*K)
				ss[e] = randScales(r, cdiv(N, 128)*kb, -7)
				wt[e], st[e] = a.up(ws[e]), a.up(ss[e])
			}
			ids := make([]int32, slots)
			for j := range ids {
				ids[j] = int32(r.IntN(E))
			}
			ids[slots-1] = ids[0] // a repeated expert
			xstride := K
			if ec.shared {
				xstride = 0
			}
			x := randF32(r, slots*K, 1)
			yp := a.poisoned(slots * N)
			chk(k.GemvFP8ExpertsWide(s, yp, a.up(x), xstride, a.up(wt), a.up(st), a.up(ids), slots, N, K))
			y := downF32(c, yp, slots*N)
			ref := make([]float64, slots*N)
			for j, e := range ids {
				part := refGemv(func(n, kk int) float64 { return fp8Table[ws[e][n*K+kk]] * float64(ss[e][(n/128)*kb+kk/128]) }, x[j*xstride:], nil, N, K, 1, K, N)
				copy(ref[j*N:], part)
			}
			record(t, fmt.Sprintf("gemv_fp8_experts_wide slots=%d N=%d K=%d shared_x=%v", slots, N, K, ec.shared)+tag, relMetric, relErr(y, ref), boundF32)
		}
	})
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

// TestGemvWideRows pins the launcher's rows-per-block choice for the
// decode shapes (132 SMs): long K takes fewer rows per block, small N fewer
// so that the grid still fills the device.
func TestGemvWideRows(t *testing.T) {
	cases := []struct{ N, K, slots, want int }{
		{256, 7168, 1, 1}, {1536, 7168, 1, 2}, {7168, 2048, 1, 8}, {7168, 16384, 1, 1},
		{256, 7168, 8, 2}, {2048, 7168, 8, 2}, {24576, 1536, 1, 8}, {576, 7168, 1, 1},
	}
	for _, cs := range cases {
		got := gemvWideRowsFor(132, cs.N, cs.K, cs.slots)
		if got != cs.want {
			t.Errorf("N=%d K=%d slots=%d: rows %d, want %d", cs.N, cs.K, cs.slots, got, cs.want)
		}
		if !slices.Contains([]int{1, 2, 4, 8}, got) {
			t.Errorf("rows %d is not a compiled variant", got)
		}
	}
}
