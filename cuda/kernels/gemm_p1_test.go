package kernels

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/tilert-go/tilert/cuda"
)

// The one-part GEMMs (serving-mode prefill, TILERT_GPU_GEMM_SPLITS=1) round
// x once, so they cannot meet float32's bound. Their bound, derived:
//
// Rounding a real v to a float of p significant bits (round to nearest)
// moves it by at most u|v| with u = 2^-p: fp16 has p = 11 (u = 2^-11),
// bf16 p = 8 (u = 2^-8; a bf16's spacing at 1 is 2^-7, half of it 2^-8).
// gemm_split_p1 first scales the row by a power of two (exact) so that its
// largest |x| is in [2^14, 2^15): every value above 2^-28 of the row's
// largest is a normal fp16 (fp16's smallest normal is 2^-14), and below
// that the subnormal rounding moves a value by at most 2^-25 (scaled), i.e.
// 2^-39 of the row's largest. The weights (e4m3 or bf16) are exact in the
// 16-bit type, so output n of row m is
//
//	sum_k w[n][k] s x[m][k] (1 + d_k), |d_k| <= u,
//
// computed in float32: |got - ref| <= u * A[m][n] + (float32 error), with
// A[m][n] = sum_k |w[n][k] s x[m][k]|. The float32 error of the tensor
// cores (accumulation truncated within a 128-wide K block, 8 k16 steps:
// <= 8 * 2^-23 of the block's partials) and of the promotions (K/128
// float32 FMAs) is below 2^-18 A. So every output must satisfy
//
//	|got - ref| <= (u + 2^-18) A[m][n] + 2^-39 * rowmax|x| * sum_k |w s|
//
// and the test checks exactly that (the last term is bounded generously by
// 1e-6 of the row's largest |ref| plus 1e-30). This is a per-output bound,
// not a statistical one, so it cannot fail on a correct kernel, and it
// fails on a real bug: a wrong K permutation, a missed tile, a wrong scale
// or row moves outputs by ~sqrt(K) |w||x|, against u K |w||x| (~2 orders
// of magnitude apart at K >= 96: 2^-11 K << sqrt(K)).
const (
	uF16 = 1.0 / 2048 // 2^-11
	uBF  = 1.0 / 256  // 2^-8
)

// onePartMetric is the check's metric: the largest ratio of an output's
// error to its own bound; <= 1 passes.
const onePartMetric = "max |d| / ((u+2^-18) sum|w s x| + 1e-6 rowmax|ref|)"

// onePartErr is onePartMetric over rows M of ldy outputs (columns >= N are
// skipped; the caller checks them), with u the 16-bit type's rounding.
func onePartErr(got []float32, ref, abs []float64, M, N, ldy int, u float64) float64 {
	worst := 0.0
	for m := range M {
		rmax := 0.0
		for n := range N {
			rmax = math.Max(rmax, math.Abs(ref[m*ldy+n]))
		}
		for n := range N {
			i := m*ldy + n
			o := float64(got[i])
			if math.IsNaN(o) || math.IsInf(o, 0) {
				return math.Inf(1)
			}
			b := (u+math.Ldexp(1, -18))*abs[i] + 1e-6*rmax + 1e-30
			worst = math.Max(worst, math.Abs(o-ref[i])/b)
		}
	}
	return worst
}

// absGemv is refGemv of |w| and |x|: A[m][n] above.
func absGemv(at func(n, k int) float64, x []float32, N, K, M, ldx, ldy int) []float64 {
	return refGemv(func(n, k int) float64 { return math.Abs(at(n, k)) }, absF32(x), nil, N, K, M, ldx, ldy)
}

func absF32(x []float32) []float32 {
	out := make([]float32, len(x))
	for i, v := range x {
		out[i] = float32(math.Abs(float64(v)))
	}
	return out
}

// TestGemmP1Permutation pins gemm_split_p1's K permutation inside a 64-wide
// tile (transcribed from gemm_p1.cu) against what the kernel's fragment
// loads assume: thread t4's word s of its 16 weight bytes (bytes 16 t4 + 4 s
// .. + 3) holds logical k {2t4, 2t4+1} of step s in its low half (b0) and
// {2t4+8, 2t4+9} in its high half (b1), mma m16n8k16's B layout; and the
// permutation is a bijection of 0..63. Runs without a GPU.
func TestGemmP1Permutation(t *testing.T) {
	phys := func(c int) int { // gemm_split_p1: logical column c -> physical k
		cc := c & 63
		s, L := cc>>4, cc&15
		return (c &^ 63) + 16*((L&7)>>1) + 4*s + 2*(L>>3) + (L & 1)
	}
	seen := map[int]bool{}
	for c := range 128 {
		p := phys(c)
		if p>>6 != c>>6 || seen[p] {
			t.Fatalf("column %d -> %d: not a bijection inside its tile", c, p)
		}
		seen[p] = true
	}
	for t4 := range 4 {
		for s := range 4 {
			for hi := range 2 {
				for lo := range 2 {
					byteAt := 16*t4 + 4*s + 2*hi + lo  // the byte's position in the loaded row
					logical := 16*s + 2*t4 + 8*hi + lo // the mma k it must be for
					if phys(logical) != byteAt {
						t.Errorf("t4 %d step %d half %d elem %d: byte %d, but the split puts k %d there", t4, s, hi, lo, byteAt, phys(logical))
					}
				}
			}
		}
	}
}

// TestKernelGemmP1 checks the one-part FP8 GEMM (gemm_p1.cu, fp16 x) and
// the one-part bf16 kernels of gemm_tc.cu (gemm_fp8_tc_s1, gemm_bf16_tc_s1)
// against the float64 reference on fresh random inputs, each output within
// its own bound (above): tails in M, N and K (K a multiple of 16 but not of
// the 64-wide tile or the 128-wide scale block; for the bf16 kernels any
// K), a padded x and y, both block heights, rows whose magnitudes differ by
// 2^+-40 (the per-row power-of-two scale) and a zero row.
func TestKernelGemmP1(t *testing.T) {
	onGPU(t, func(c *cuda.Ctx, k *Set, a *allocs, r *rand.Rand) {
		if !k.GemmP1OK(0, 16) {
			t.Skip("gemm p1 needs sm_89+")
		}
		s := c.Stream()
		for _, cs := range []struct{ N, K, M, pad int }{
			{576, 7168, 24, 0}, {256, 1536, 100, 0}, {130, 2112, 17, 0}, {300, 160, 130, 4},
			{129, 96, 16, 0}, {64, 208, 33, 0}, {200, 112, 20, 3}, {300, 7168, 200, 0}, {1000, 2048, 129, 0},
			{384, 16, 70, 0}, {256, 2048, 300, 0},
		} {
			N, K, M := cs.N, cs.K, cs.M
			ldx, ldy := K+cs.pad, N+cs.pad
			w := randFP8(r, N*K)
			sc := randScales(r, cdiv(N, 128)*cdiv(K, 128), -8)
			x := randScaledRows(r, M, K, ldx)
			scratchBytes := GemmP1ScratchBytes(M, K)
			scratch := a.raw(scratchBytes)
			at := fp8At(w, sc, K)
			ref := refGemv(at, x, nil, N, K, M, ldx, ldy)
			abs := absGemv(at, x, N, K, M, ldx, ldy)
			for _, bm := range []int{64, 128} {
				yp := a.poisoned(M * ldy)
				chk(k.GemmFP8P1(s, yp, a.up(x), a.up(w), a.up(sc), scratch, scratchBytes, N, K, M, ldx, ldy, bm))
				got := downF32(c, yp, M*ldy)
				for m := range M {
					for n := N; n < ldy; n++ {
						if got[m*ldy+n] == got[m*ldy+n] {
							t.Errorf("gemm_fp8_p1 wrote past N at row %d col %d", m, n)
						}
					}
				}
				e := onePartErr(got, ref, abs, M, N, ldy, uF16)
				t.Logf("gemm_fp8_p1 bm=%d N=%d K=%d M=%d: %s %.3g (max|d|/max|ref| %.3g)", bm, N, K, M, onePartMetric, e, relErrRows(got, ref, M, N, ldy))
				record(t, fmt.Sprintf("gemm_fp8_p1 bm=%d N=%d K=%d M=%d ldx=%d ldy=%d", bm, N, K, M, ldx, ldy), onePartMetric, e, 1)
			}
			// The bf16 one-part kernels (rows unscaled: bf16 has float32's range).
			yp := a.poisoned(M * ldy)
			chk(k.GemmFP8(s, yp, a.up(x), a.up(w), a.up(sc), N, K, M, ldx, ldy, 1))
			record(t, fmt.Sprintf("gemm_fp8_tc s=1 N=%d K=%d M=%d ldx=%d ldy=%d", N, K, M, ldx, ldy), onePartMetric,
				onePartErr(downF32(c, yp, M*ldy), ref, abs, M, N, ldy, uBF), 1)
		}
		// bf16 weights, K not a multiple of 16 (the scalar load path) too.
		for _, cs := range []struct{ N, K, M int }{{300, 7168, 80}, {129, 100, 17}, {64, 200, 33}, {256, 1536, 100}} {
			N, K, M := cs.N, cs.K, cs.M
			wb := randBF16(r, N*K, 0.05)
			x := randF32(r, M*K, 1)
			at := func(n, kk int) float64 { return bf16ToF64(wb[n*K+kk]) }
			ref := refGemv(at, x, nil, N, K, M, K, N)
			abs := absGemv(at, x, N, K, M, K, N)
			yp := a.poisoned(M * N)
			chk(k.GemmBF16(s, yp, a.up(x), a.up(wb), N, K, M, K, N, 1))
			record(t, fmt.Sprintf("gemm_bf16_tc s=1 N=%d K=%d M=%d", N, K, M), onePartMetric, onePartErr(downF32(c, yp, M*N), ref, abs, M, N, N, uBF), 1)
		}
	})
}

// relErrRows is relErr over the first N columns of M rows of ldy.
func relErrRows(got []float32, ref []float64, M, N, ldy int) float64 {
	g := make([]float32, 0, M*N)
	rf := make([]float64, 0, M*N)
	for m := range M {
		g = append(g, got[m*ldy:m*ldy+N]...)
		rf = append(rf, ref[m*ldy:m*ldy+N]...)
	}
	return relErr(g, rf)
}

// TestKernelGemmExpertsP1 checks the grouped routed-expert GEMM with x
// rounded once (gemm_fp8_experts_p1, both tile heights; and
// gemm_fp8_experts_tc_s1) against the float64 GEMV of each pair's token and
// expert, every output within its own one-part bound.
func TestKernelGemmExpertsP1(t *testing.T) {
	onGPU(t, func(c *cuda.Ctx, k *Set, a *allocs, r *rand.Rand) {
		if !k.GemmP1OK(0, 16) {
			t.Skip("gemm p1 needs sm_89+")
		}
		s := c.Stream()
		for _, ec := range []struct{ E, K, rows, topk, N, D int }{
			{8, 3, 150, 3, 200, 384}, {16, 8, 70, 8, 256, 2048}, {5, 2, 40, 2, 130, 112}, {4, 2, 300, 2, 136, 256}, {3, 2, 200, 2, 256, 7168},
		} {
			E, T, N, D := ec.E, ec.rows, ec.N, ec.D
			ex := randFP8Experts(r, a, E, N, D)
			K := ec.topk
			ids, pairs := randRouting(r, E, T, K)
			xrows := make([]int32, len(pairs))
			eid := make([]int32, len(pairs))
			for i, p := range pairs {
				xrows[i], eid[i] = int32(p/K), ids[p]
			}
			x := randF32(r, T*D, 1)
			P := len(pairs)
			scratchBytes := GemmP1ScratchBytes(T, D)
			ref := make([]float64, P*N)
			abs := make([]float64, P*N)
			for i, p := range pairs {
				e, m := ids[p], p/K
				copy(ref[i*N:], refGemv(ex.at(int(e)), x[m*D:], nil, N, D, 1, D, N))
				copy(abs[i*N:], absGemv(ex.at(int(e)), x[m*D:], N, D, 1, D, N))
			}
			for _, big := range []bool{false, true} {
				tiles, nbig := ExpertTiles(eid, big)
				yp := a.poisoned(P * N)
				chk(k.GemmFP8ExpertsP1(s, yp, a.up(x), D, T, a.up(ex.wp), a.up(ex.sp), a.up(tiles), a.up(xrows), a.raw(scratchBytes), scratchBytes,
					len(tiles)/3, nbig, N, D))
				record(t, fmt.Sprintf("gemm_fp8_experts_p1 big=%v (%d of %d tiles) E=%d rows=%d top%d N=%d K=%d", big, nbig, len(tiles)/3, E, T, K, N, D),
					onePartMetric, onePartErr(downF32(c, yp, P*N), ref, abs, P, N, N, uF16), 1)
			}
			tiles, _ := ExpertTiles(eid, false)
			yp := a.poisoned(P * N)
			chk(k.GemmFP8Experts(s, yp, a.up(x), D, a.up(ex.wp), a.up(ex.sp), a.up(tiles), a.up(xrows), len(tiles)/3, N, D, 1))
			record(t, fmt.Sprintf("gemm_fp8_experts_tc s=1 E=%d rows=%d top%d N=%d K=%d", E, T, K, N, D),
				onePartMetric, onePartErr(downF32(c, yp, P*N), ref, abs, P, N, N, uBF), 1)
		}
	})
}

// TestKernelGemmP1Timing reports (never asserts) the one-part FP8 GEMM at
// the 8192-token prefill's DeepSeek-V3.2 shapes against gemm_fp8_tc with 3
// bf16 parts (today's path) and 1 part, next to a device-to-device copy;
// then the grouped experts at 8192 tokens x top-8 of 256 experts (uniform
// random routing). TILERT_GPU_TIMING=1 only.
func TestKernelGemmP1Timing(t *testing.T) {
	needTiming(t)
	onGPU(t, func(c *cuda.Ctx, k *Set, a *allocs, r *rand.Rand) {
		if !k.GemmP1OK(0, 16) {
			t.Skip("gemm p1 needs sm_89+")
		}
		s := c.Stream()
		add := timingTable(t, c, a, r, 1<<30, "copy d2d 1 GiB", "reference")
		const M = 8192
		x := a.raw(int64(4 * M * 18432))
		fillRandom(c, r, x, int64(4*M*18432), "f32")
		y := a.raw(int64(4 * M * 24576))
		scratchBytes := GemmP1ScratchBytes(M, 18432)
		scratch := a.raw(scratchBytes)
		for _, sh := range []struct{ N, K int }{
			{18432, 7168}, {7168, 16384}, {7168, 18432}, {24576, 1536}, {576, 7168}, {1536, 7168}, {2048, 7168},
		} {
			N, K := sh.N, sh.K
			w, sc := devFP8(c, a, r, N, K)
			flop := 2 * float64(N) * float64(K) * float64(M)
			bytes := float64(N*K + 4*M*K + 4*M*N) // weights, x and y once
			line := fmt.Sprintf("N=%5d K=%5d M=%d:", N, K, M)
			us3 := medianUs(c, s, 1, 3, func() { chk(k.GemmFP8(s, y, x, w, sc, N, K, M, K, N, 3)) })
			line += fmt.Sprintf("  tc_s3 %8.1f us %6.1f TFLOP/s", us3, flop/us3/1e6)
			us1 := medianUs(c, s, 1, 3, func() { chk(k.GemmFP8(s, y, x, w, sc, N, K, M, K, N, 1)) })
			line += fmt.Sprintf("  tc_s1 %8.1f us %6.1f", us1, flop/us1/1e6)
			for _, bm := range []int{64, 128} {
				us := medianUs(c, s, 2, 5, func() { chk(k.GemmFP8P1(s, y, x, w, sc, scratch, scratchBytes, N, K, M, K, N, bm)) })
				line += fmt.Sprintf("  p1_b%d %8.1f us %6.1f", bm, us, flop/us/1e6)
				add(fmt.Sprintf("gemm_fp8_p1 bm=%d N=%d K=%d M=%d", bm, N, K, M), bytes, us, fmt.Sprintf("%.1f TFLOP/s (tc_s3 %.1f)", flop/us/1e6, flop/us3/1e6))
			}
			// The split alone (its share of the p1 time).
			xs := scratch
			Kp := cdiv(K, gemmP1K) * gemmP1K
			usS := medianUs(c, s, 2, 5, func() {
				chk(k.launch("gemm_split_p1", cuda.D1(M), cuda.D1(256), 0, s, x, K, K, Kp, xs, xs.Add(2*int64(M)*int64(Kp))))
			})
			line += fmt.Sprintf("  (split %6.1f us)", usS)
			t.Log(line)
		}

		// Experts: 8192 tokens x top-8 of 256, gate (2048 x 7168) and down
		// (7168 x 2048) shapes.
		const E, topk = 256, 8
		P := M * topk
		ids, pairs := randRouting(r, E, M, topk)
		xrows := make([]int32, P)
		ident := make([]int32, P)
		eid := make([]int32, P)
		for i, p := range pairs {
			xrows[i], eid[i], ident[i] = int32(p/topk), ids[p], int32(i)
		}
		xr, id := a.up(xrows), a.up(ident)
		ey := a.raw(int64(4 * P * 7168))
		ex := a.raw(int64(4 * P * 2048))
		fillRandom(c, r, ex, int64(4*P*2048), "f32")
		escratchBytes := GemmP1ScratchBytes(P, 7168)
		escratch := a.raw(escratchBytes)
		for _, sh := range []struct {
			N, K int
			name string
		}{{2048, 7168, "gate/up"}, {7168, 2048, "down"}} {
			N, K := sh.N, sh.K
			ws, ss := devFP8s(c, a, r, E, N, K)
			wt, st := a.up(ws), a.up(ss)
			in, rows, ldx := x, M, K
			if sh.name == "down" {
				in, rows, ldx = ex, P, K
			}
			rowsOf := xr
			if sh.name == "down" {
				rowsOf = id
			}
			flop := 2 * float64(N) * float64(K) * float64(P)
			line := fmt.Sprintf("experts %s N=%d K=%d pairs=%d:", sh.name, N, K, P)
			tl, _ := ExpertTiles(eid, false)
			tiles := a.up(tl)
			us3 := medianUs(c, s, 1, 3, func() { chk(k.GemmFP8Experts(s, ey, in, ldx, wt, st, tiles, rowsOf, len(tl)/3, N, K, 3)) })
			line += fmt.Sprintf("  tc_s3 %8.1f us %6.1f TFLOP/s", us3, flop/us3/1e6)
			for _, big := range []bool{false, true} {
				tlb, nbig := ExpertTiles(eid, big)
				tb := a.up(tlb)
				us := medianUs(c, s, 2, 5, func() {
					chk(k.GemmFP8ExpertsP1(s, ey, in, ldx, rows, wt, st, tb, rowsOf, escratch, escratchBytes, len(tlb)/3, nbig, N, K))
				})
				line += fmt.Sprintf("  p1 big=%v (%d tiles) %8.1f us %6.1f", big, len(tlb)/3, us, flop/us/1e6)
				add(fmt.Sprintf("gemm_fp8_experts_p1 %s big=%v pairs=%d", sh.name, big, P), float64(E*N*K+4*rows*K+4*P*N), us,
					fmt.Sprintf("%.1f TFLOP/s (tc_s3 %.1f)", flop/us/1e6, flop/us3/1e6))
			}
			t.Log(line)
		}
	})
}

// TestOnePartBoundFits shows (without a GPU) that the one-part check's
// bound holds for a faithful CPU transcription of gemm_p1 (x scaled per row
// by a power of two, rounded to fp16, float32 partials per 128-wide K block
// promoted with the block scale) at the kernel test's shapes, and fails for
// the bugs it exists to catch: two k of a tile swapped in x (a wrong
// permutation), one scale block off, the last K tile dropped.
func TestOnePartBoundFits(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 8))
	f16 := func(v float64) float64 { // round to nearest fp16 (normal range suffices here)
		if v == 0 {
			return 0
		}
		e := math.Floor(math.Log2(math.Abs(v)))
		q := math.Ldexp(1, int(e)-10)
		return math.RoundToEven(v/q) * q
	}
	for _, cs := range []struct{ N, K, M int }{{130, 2112, 17}, {256, 1536, 40}, {64, 208, 33}, {129, 96, 16}} {
		N, K, M := cs.N, cs.K, cs.M
		w := randFP8(r, N*K)
		sc := randScales(r, cdiv(N, 128)*cdiv(K, 128), -8)
		x := randF32(r, M*K, 1)
		at := fp8At(w, sc, K)
		ref := refGemv(at, x, nil, N, K, M, K, N)
		abs := absGemv(at, x, N, K, M, K, N)
		kb := cdiv(K, 128)
		sim := func(bug int) []float32 {
			y := make([]float32, M*N)
			for m := range M {
				xr := x[m*K : (m+1)*K]
				mx := 0.0
				for _, v := range xr {
					mx = math.Max(mx, math.Abs(float64(v)))
				}
				_, e := math.Frexp(mx)
				s := math.Ldexp(1, 15-e)
				xs := make([]float64, K)
				for k, v := range xr {
					xs[k] = f16(float64(v) * s)
				}
				if bug == 1 {
					xs[3], xs[5] = xs[5], xs[3]
				}
				for n := range N {
					var acc float32
					for b := range kb {
						var part float32
						for k := b * 128; k < min(K, b*128+128); k++ {
							if bug == 3 && k >= (K-1)/64*64 {
								break
							}
							part += float32(fp8Table[w[n*K+k]] * xs[k])
						}
						bs := b
						if bug == 2 && b == 0 {
							bs = 1
						}
						acc = float32(math.FMA(float64(part), float64(sc[(n/128)*kb+bs]), float64(acc)))
					}
					y[m*N+n] = acc * float32(math.Ldexp(1, e-15))
				}
			}
			return y
		}
		if e := onePartErr(sim(0), ref, abs, M, N, N, uF16); e > 1 {
			t.Errorf("N=%d K=%d M=%d: a faithful one-part product at %.3g of the bound", N, K, M, e)
		} else {
			t.Logf("N=%d K=%d M=%d: faithful %.3g of the bound", N, K, M, e)
		}
		for bug, what := range map[int]string{1: "swapped k", 2: "wrong scale block", 3: "last tile dropped"} {
			if bug == 2 && kb == 1 {
				continue
			}
			if e := onePartErr(sim(bug), ref, abs, M, N, N, uF16); e <= 1 {
				t.Errorf("N=%d K=%d M=%d: %s passes (%.3g of the bound)", N, K, M, what, e)
			} else {
				t.Logf("N=%d K=%d M=%d: %s at %.3g of the bound", N, K, M, what, e)
			}
		}
	}
}
