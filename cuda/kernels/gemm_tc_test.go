package kernels

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/tilert-go/tilert/cuda"
)

// boundGemm2 is the bound of the 2-part split of x (16 bits of mantissa:
// ~2^-17 relative per product).
const boundGemm2 = 6e-5

// TestKernelGemmTC checks the tensor-core GEMMs (fp8 with block scales,
// bf16) against the float64 reference on fresh random inputs: tails in M, N
// and K (partial scale blocks, K not a multiple of the 32-wide tile or of
// 16 bytes, so the scalar load path), a padded x, both splits of x.
func TestKernelGemmTC(t *testing.T) {
	onGPU(t, func(c *cuda.Ctx, k *Set, a *allocs, r *rand.Rand) {
		s := c.Stream()
		type tc struct{ N, K, M, pad int }
		cases := []tc{
			{576, 7168, 24, 0}, {256, 1536, 100, 0}, {130, 2112, 17, 0}, {300, 160, 130, 4},
			{129, 96, 16, 0}, {64, 200, 33, 0}, {200, 100, 20, 3}, {300, 7168, 80, 0},
		}
		for _, splits := range []int{3, 2} {
			bound := boundF32
			if splits == 2 {
				bound = boundGemm2
			}
			for _, cs := range cases {
				N, K, M := cs.N, cs.K, cs.M
				ldx := K + cs.pad
				w := randFP8(r, N*K)
				sc := randScales(r, cdiv(N, 128)*cdiv(K, 128), -8)
				x := randF32(r, M*ldx, 1)
				yp := a.poisoned(M * N)
				chk(k.GemmFP8(s, yp, a.up(x), a.up(w), a.up(sc), N, K, M, ldx, N, splits))
				ref := refGemv(fp8At(w, sc, K), x, nil, N, K, M, ldx, N)
				record(t, fmt.Sprintf("gemm_fp8_tc s=%d N=%d K=%d M=%d ldx=%d", splits, N, K, M, ldx), relMetric, relErr(downF32(c, yp, M*N), ref), bound)

				wb := randBF16(r, N*K, 0.05)
				yb := a.poisoned(M * (N + 5))
				chk(k.GemmBF16(s, yb, a.up(x), a.up(wb), N, K, M, ldx, N+5, splits))
				refB := refGemv(func(n, kk int) float64 { return bf16ToF64(wb[n*K+kk]) }, x, nil, N, K, M, ldx, N+5)
				got := downF32(c, yb, M*(N+5))
				for m := range M { // columns past N stay untouched (the poison), ref is 0 there
					for n := N; n < N+5; n++ {
						if got[m*(N+5)+n] == got[m*(N+5)+n] {
							t.Errorf("gemm_bf16_tc wrote past N at row %d col %d", m, n)
						}
						got[m*(N+5)+n] = 0
					}
				}
				record(t, fmt.Sprintf("gemm_bf16_tc s=%d N=%d K=%d M=%d ldy=%d", splits, N, K, M, N+5), relMetric, relErr(got, refB), bound)
			}
		}
	})
}

// TestKernelGemmExpertsTC checks the grouped routed-expert GEMM and the
// row combine: random top-k choices are sorted by expert into tiles as the
// engine does (engine/gpu moePrefill), each pair's output against the
// float64 GEMV of its token and expert, then the weighted sums per row.
func TestKernelGemmExpertsTC(t *testing.T) {
	onGPU(t, func(c *cuda.Ctx, k *Set, a *allocs, r *rand.Rand) {
		s := c.Stream()
		for _, ec := range []struct{ E, K, rows, topk, N, D int }{{8, 3, 150, 3, 200, 384}, {16, 8, 70, 8, 256, 2048}, {5, 2, 40, 2, 130, 100}} {
			E, T, N, D := ec.E, ec.rows, ec.N, ec.D
			ex := randFP8Experts(r, a, E, N, D)
			K := ec.topk
			// Pairs sorted by expert; tiles of at most GemmTileRows pairs.
			ids, pairs := randRouting(r, E, T, K)
			xrows := make([]int32, len(pairs))
			pos := make([]int32, len(pairs))
			var tiles []int32
			for i, p := range pairs {
				xrows[i] = int32(p / K)
				pos[p] = int32(i)
				if i == 0 || ids[pairs[i-1]] != ids[p] || tiles[len(tiles)-1] == GemmTileRows {
					tiles = append(tiles, ids[p], int32(i), 0)
				}
				tiles[len(tiles)-1]++
			}
			x := randF32(r, T*D, 1)
			P := len(pairs)
			yp := a.poisoned(P * N)
			chk(k.GemmFP8Experts(s, yp, a.up(x), D, a.up(ex.wp), a.up(ex.sp), a.up(tiles), a.up(xrows), len(tiles)/3, N, D, 3))
			y := downF32(c, yp, P*N)
			ref := make([]float64, P*N)
			for i, p := range pairs {
				e, m := ids[p], p/K
				copy(ref[i*N:], refGemv(ex.at(int(e)), x[m*D:], nil, N, D, 1, D, N))
			}
			record(t, fmt.Sprintf("gemm_fp8_experts_tc E=%d rows=%d top%d N=%d K=%d", E, T, K, N, D), relMetric, relErr(y, ref), boundF32)

			wts := randF32(r, T*K, 1)
			op := a.poisoned(T * N)
			chk(k.MoECombineRows(s, op, yp, a.up(wts), a.up(pos), T, K, N))
			refC := make([]float64, T*N)
			for m := range T {
				for j := range K {
					for n := range N {
						refC[m*N+n] += float64(wts[m*K+j]) * float64(y[int(pos[m*K+j])*N+n])
					}
				}
			}
			record(t, fmt.Sprintf("moe_combine_rows rows=%d k=%d N=%d", T, K, N), relMetric, relErr(downF32(c, op, T*N), refC), boundF32)
		}
	})
}

// TestKernelGemmTCTiming reports (never asserts) the tensor-core GEMM's
// rate at the prefill's DeepSeek-V3.2 shapes, against the 4-row GEMV that
// prefill used before, for both splits of x. TILERT_GPU_TIMING=1 only.
func TestKernelGemmTCTiming(t *testing.T) {
	needTiming(t)
	onGPU(t, func(c *cuda.Ctx, k *Set, a *allocs, r *rand.Rand) {
		s := c.Stream()
		for _, sh := range []struct{ N, K, M int }{
			{18432, 7168, 256}, {18432, 7168, 1024}, {7168, 16384, 512}, {24576, 1536, 512}, {576, 7168, 512}, {7168, 2048, 512},
		} {
			N, K, M := sh.N, sh.K, sh.M
			w, sc := devFP8(c, a, r, N, K)
			x := a.up(randF32(r, M*K, 1))
			y := a.raw(int64(4 * M * N))
			flop := 2 * float64(N) * float64(K) * float64(M)
			for _, sp := range []int{3, 2} {
				us := medianUs(c, s, 3, 5, func() { chk(k.GemmFP8(s, y, x, w, sc, N, K, M, K, N, sp)) })
				t.Logf("gemm_fp8_tc s=%d N=%d K=%d M=%d: %9.1f us %7.1f TFLOP/s", sp, N, K, M, us, flop/us/1e6)
			}
			us := medianUs(c, s, 1, 3, func() {
				for m := 0; m < M; m += 4 {
					chk(k.GemvFP8(s, y.Add(int64(4*m*N)), x.Add(int64(4*m*K)), w, sc, 0, N, K, 4, K, N))
				}
			})
			t.Logf("gemv_fp8 x%d N=%d K=%d M=%d:       %9.1f us %7.1f TFLOP/s", M/4, N, K, M, us, flop/us/1e6)
		}
	})
}

// TestKernelAbsorbTCTiming reports (never asserts) the prefill's absorbed-MLA
// products at 2048 rows, 128 heads: absorb_tc against absorb_q_fp8 /
// absorb_v_fp8. TILERT_GPU_TIMING=1 only.
func TestKernelAbsorbTCTiming(t *testing.T) {
	needTiming(t)
	onGPU(t, func(c *cuda.Ctx, k *Set, a *allocs, r *rand.Rand) {
		s := c.Stream()
		const M, H, nope, R, vd, P = 2048, 128, 128, 512, 128, 64
		hs := nope + P
		q := a.up(randF32(r, M*H*hs, 1))
		uk, _ := devFP8(c, a, r, H*nope, R)
		uv, _ := devFP8(c, a, r, H*vd, R)
		// per-row scales [rows][R/128]
		uks, uvs := a.up(randF32(r, H*nope*R/128, 0.01)), a.up(randF32(r, H*vd*R/128, 0.01))
		out := a.raw(int64(4 * M * H * R))
		qpe := a.raw(int64(4 * M * H * P))
		x := a.up(randF32(r, M*H*R, 1))
		vo := a.raw(int64(4 * M * H * vd))
		flopQ := 2 * float64(M) * H * nope * R
		us0 := medianUs(c, s, 2, 3, func() { chk(k.AbsorbQFP8(s, out, qpe, q, uk, uks, M, H, nope, R, H*hs, hs, P, QRope{})) })
		us1 := medianUs(c, s, 2, 3, func() { chk(k.AbsorbQTC(s, out, q, uk, uks, M, H, nope, R, H*hs, hs)) })
		t.Logf("absorb q M=%d H=%d: absorb_q_fp8 %8.1f us, absorb_tc %8.1f us (%.1f TFLOP/s)", M, H, us0, us1, flopQ/us1/1e6)
		us0 = medianUs(c, s, 2, 3, func() { chk(k.AbsorbVFP8(s, vo, x, uv, uvs, M, H, vd, R, H*vd)) })
		us1 = medianUs(c, s, 2, 3, func() { chk(k.AbsorbVTC(s, vo, x, uv, uvs, M, H, vd, R, H*vd)) })
		t.Logf("absorb v M=%d H=%d: absorb_v_fp8 %8.1f us, absorb_tc %8.1f us (%.1f TFLOP/s)", M, H, us0, us1, flopQ/us1/1e6)
	})
}

// randRouting routes T rows to k distinct experts of E each at random and
// sorts the T*k pairs by expert (stable): ids [T*k] (row m's j-th expert at
// m*k+j), pairs (the pair indices in expert order).
func randRouting(r *rand.Rand, E, T, k int) (ids []int32, pairs []int) {
	ids = make([]int32, T*k)
	for m := range T {
		perm := r.Perm(E)
		for j := range k {
			ids[m*k+j] = int32(perm[j])
		}
	}
	pairs = make([]int, T*k)
	for i := range pairs {
		pairs[i] = i
	}
	slices.SortStableFunc(pairs, func(p, q int) int { return int(ids[p]) - int(ids[q]) })
	return ids, pairs
}

// randScaledRows is M rows of K random values (row stride ldx), each row
// scaled by its own power of two in [2^-40, 2^40] and the middle row zero:
// the row scales of the fp16-split GEMMs (gemm_p1) must hold
// across the range and on a zero row.
func randScaledRows(r *rand.Rand, M, K, ldx int) []float32 {
	x := randF32(r, M*ldx, 1)
	for m := range M {
		f := float32(math.Ldexp(1, r.IntN(81)-40))
		if m == M/2 {
			f = 0
		}
		for kk := range K {
			x[m*ldx+kk] *= f
		}
	}
	return x
}
