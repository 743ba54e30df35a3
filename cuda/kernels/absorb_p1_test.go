package kernels

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/tilert-go/tilert/cuda"
)

// The one-part absorbed-MLA products (absorb_p1, gemm_p1_absorb.cu). Their
// bound is gemm_p1's one-part bound (gemm_p1_test.go), derived the same
// way: each x value the tensor cores multiply is x (1 + d), |d| <= 2^-11
// (one fp16 rounding after an exact power-of-two scale; in q mode x is the
// float32 product q * S[d][c/128], whose own rounding, 2^-24, is inside the
// 2^-18 float32 term), e4m3 weights are exact in fp16, the products
// accumulate in float32. So every output satisfies
//
//	|got - ref| <= (2^-11 + 2^-18) sum_k |w s x| + 1e-6 rowmax|ref|
//
// (onePartErr; "row" here is one (token, head) output row in q mode, one
// token's H*vd outputs in v mode). A wrong head, row, column, k, scale or a
// dropped K block moves outputs by ~sqrt(K) |w||x|, two orders above it.
//
// The second check pins the rounding itself, which the engine's emulator
// transcribes (engine/gpu absorbQP1 / absorbVP1): the GPU against a host
// transcription of exactly that x (scaled per row and 128-wide K block, q
// mode with S folded in first, rounded to nearest even fp16), float64
// products of it: they may differ only by float32 summation, 2^-18 of
// sum |w s x'| (+ 1e-6 rowmax as above). A rounding that differs from the
// transcription (another scale grouping, bf16, truncation) moves a value
// by up to 2^-11 of itself and fails this bound on random inputs.

// f16RoundTest rounds v to the nearest fp16 (ties to even, subnormals).
func f16RoundTest(v float64) float64 {
	a := math.Abs(v)
	if a == 0 || math.IsNaN(a) || math.IsInf(a, 0) {
		return v
	}
	q := math.Ldexp(1, -24)
	if a >= math.Ldexp(1, -14) {
		q = math.Ldexp(1, math.Ilogb(a)-10)
	}
	return math.RoundToEven(v/q) * q
}

// p1Block writes the one-part x' of the block src into dst: the power of
// two bringing the block's largest |x| into [2^14, 2^15), fp16, scaled back.
func p1Block(dst []float64, src []float32) {
	var mx float32
	for _, v := range src {
		mx = max(mx, float32(math.Abs(float64(v))))
	}
	e := 15
	if mx > 0 && mx <= math.MaxFloat32 {
		_, e = math.Frexp(float64(mx))
		e = max(-100, min(100, e))
	}
	for i, v := range src {
		dst[i] = f16RoundTest(float64(v*float32(math.Ldexp(1, 15-e)))) * math.Ldexp(1, e-15)
	}
}

const absorbP1SimMetric = "max |d| / (2^-18 sum|w s x'| + 1e-6 rowmax|ref|)"

// simErr is absorbP1SimMetric: got against the transcription sim (abs its
// sum |w s x'|), rows M of N outputs ldy apart.
func simErr(got []float32, sim, abs []float64, M, N, ldy int) float64 {
	worst := 0.0
	for m := range M {
		rmax := 0.0
		for n := range N {
			rmax = math.Max(rmax, math.Abs(sim[m*ldy+n]))
		}
		for n := range N {
			i := m*ldy + n
			o := float64(got[i])
			if math.IsNaN(o) || math.IsInf(o, 0) {
				return math.Inf(1)
			}
			worst = math.Max(worst, math.Abs(o-sim[i])/(math.Ldexp(1, -18)*abs[i]+1e-6*rmax+1e-30))
		}
	}
	return worst
}

// TestKernelAbsorbP1 checks absorb_p1 (both modes) against the float64
// products on fresh random inputs (the one-part bound) and against the
// transcribed rounding (the float32 bound): many rows (64-row block
// tails), DeepSeek's nope 128 and vd 128, GLM-5's nope 192 (a K tail inside
// the second K block) and vd 256 (two column blocks), vd 48 (a column
// tail), padded strides (ldq not a multiple of 4: the scalar load path),
// rows scaled apart by 2^+-40 and a zero row, per-row weight scales.
func TestKernelAbsorbP1(t *testing.T) {
	onGPU(t, func(c *cuda.Ctx, k *Set, a *allocs, r *rand.Rand) {
		if !k.AbsorbP1OK(0, 512) {
			t.Skip("absorb_p1 needs sm_89+")
		}
		s := c.Stream()
		const R, P = 512, 64
		rb := R / 128
		for _, sh := range []struct{ M, H, nope, vd, qpad int }{
			{1, 4, 32, 32, 0}, {70, 5, 128, 48, 3}, {130, 3, 128, 128, 4}, {65, 4, 192, 256, 1}, {200, 2, 128, 128, 0}, {16, 6, 64, 64, 2},
		} {
			M, H, nope, vd := sh.M, sh.H, sh.nope, sh.vd
			hs := nope + P
			ldq := H*hs + sh.qpad
			q := randScaledRows(r, M, ldq, ldq)
			wk := func(n int) ([]byte, []float32) {
				w, sc := randFP8(r, n*R), randF32(r, n*rb, 0.01)
				for i := range sc {
					sc[i] = float32(math.Abs(float64(sc[i]))) + 1e-3
				}
				return w, sc
			}
			// q mode.
			uk, uks := wk(H * nope)
			ref := make([]float64, M*H*R)
			abs := make([]float64, M*H*R)
			sim := make([]float64, M*H*R)
			simAbs := make([]float64, M*H*R)
			xs := make([]float32, 128)
			xr := make([]float64, 128)
			for m := range M {
				for h := range H {
					o := (m*H + h) * R
					for col := range R {
						for d := range nope {
							wv := fp8Table[uk[(h*nope+d)*R+col]] * float64(uks[(h*nope+d)*rb+col/128])
							qv := float64(q[m*ldq+h*hs+d])
							ref[o+col] += wv * qv
							abs[o+col] += math.Abs(wv * qv)
						}
					}
					for cb := range rb {
						for k0 := 0; k0 < nope; k0 += 128 {
							n := min(128, nope-k0)
							for i := range n {
								d := k0 + i
								xs[i] = q[m*ldq+h*hs+d] * uks[(h*nope+d)*rb+cb]
							}
							p1Block(xr[:n], xs[:n])
							for col := cb * 128; col < cb*128+128; col++ {
								for i := range n {
									wv := fp8Table[uk[(h*nope+k0+i)*R+col]]
									sim[o+col] += wv * xr[i]
									simAbs[o+col] += math.Abs(wv * xr[i])
								}
							}
						}
					}
				}
			}
			out := a.poisoned(M * H * R)
			chk(k.AbsorbQP1(s, out, a.up(q), a.up(uk), a.up(uks), M, H, nope, R, ldq, hs))
			got := downF32(c, out, M*H*R)
			name := fmt.Sprintf("absorb_p1 q M=%d H=%d nope=%d ldq=%d", M, H, nope, ldq)
			record(t, name, onePartMetric, onePartErr(got, ref, abs, M*H, R, R, uF16), 1)
			record(t, name+" vs transcribed rounding", absorbP1SimMetric, simErr(got, sim, simAbs, M*H, R, R), 1)

			// v mode.
			x := randScaledRows(r, M, H*R, H*R)
			uv, uvs := wk(H * vd)
			ldo := H*vd + 3
			refV := make([]float64, M*ldo)
			absV := make([]float64, M*ldo)
			simV := make([]float64, M*ldo)
			simAbsV := make([]float64, M*ldo)
			xv := make([]float64, R)
			for m := range M {
				for h := range H {
					xrow := x[(m*H+h)*R : (m*H+h+1)*R]
					for b := range rb {
						p1Block(xv[b*128:(b+1)*128], xrow[b*128:(b+1)*128])
					}
					for v := range vd {
						o := m*ldo + h*vd + v
						for col := range R {
							wv := fp8Table[uv[(h*vd+v)*R+col]] * float64(uvs[(h*vd+v)*rb+col/128])
							refV[o] += wv * float64(xrow[col])
							absV[o] += math.Abs(wv * float64(xrow[col]))
							simV[o] += wv * xv[col]
							simAbsV[o] += math.Abs(wv * xv[col])
						}
					}
				}
			}
			vo := a.poisoned(M * ldo)
			chk(k.AbsorbVP1(s, vo, a.up(x), a.up(uv), a.up(uvs), M, H, vd, R, ldo))
			vgot := downF32(c, vo, M*ldo)
			for m := range M {
				for i := H * vd; i < ldo; i++ {
					if vgot[m*ldo+i] == vgot[m*ldo+i] {
						t.Errorf("absorb_p1 v wrote past H*vd at row %d col %d", m, i)
					}
				}
			}
			name = fmt.Sprintf("absorb_p1 v M=%d H=%d vd=%d ldo=%d", M, H, vd, ldo)
			record(t, name, onePartMetric, onePartErr(vgot, refV, absV, M, H*vd, ldo, uF16), 1)
			record(t, name+" vs transcribed rounding", absorbP1SimMetric, simErr(vgot, simV, simAbsV, M, H*vd, ldo), 1)
		}
	})
}

// TestAbsorbP1BoundFails shows (without a GPU) that the checks above can
// fail: a transcription with the bugs they exist to catch (a head's
// weights from the next head, one k's weight row skipped, the row scale of
// q mode taken before the weight scale is folded in and the result
// rounded to bf16) lands outside the bounds, while the faithful one is
// inside.
func TestAbsorbP1BoundFails(t *testing.T) {
	r := rand.New(rand.NewPCG(11, 12))
	const M, H, nope, R = 5, 3, 128, 256
	rb := R / 128
	q := randF32(r, M*H*nope, 1)
	w := randFP8(r, H*nope*R)
	sc := make([]float32, H*nope*rb)
	for i := range sc {
		sc[i] = float32(0.001 + 0.01*r.Float64())
	}
	ref := make([]float64, M*H*R)
	abs := make([]float64, M*H*R)
	for m := range M {
		for h := range H {
			for col := range R {
				for d := range nope {
					wv := fp8Table[w[(h*nope+d)*R+col]] * float64(sc[(h*nope+d)*rb+col/128])
					ref[(m*H+h)*R+col] += wv * float64(q[(m*H+h)*nope+d])
					abs[(m*H+h)*R+col] += math.Abs(wv * float64(q[(m*H+h)*nope+d]))
				}
			}
		}
	}
	run := func(bug int) []float32 {
		out := make([]float32, M*H*R)
		xs := make([]float32, nope)
		xr := make([]float64, nope)
		for m := range M {
			for h := range H {
				hw := h
				if bug == 1 {
					hw = (h + 1) % H
				}
				for cb := range rb {
					for d := range nope {
						xs[d] = q[(m*H+h)*nope+d] * sc[(hw*nope+d)*rb+cb]
					}
					p1Block(xr, xs)
					if bug == 3 {
						for d := range nope {
							xr[d] = float64(bf16Round32(float32(xr[d])))
						}
					}
					for col := cb * 128; col < cb*128+128; col++ {
						var acc float64
						for d := range nope {
							if bug == 2 && d == 7 {
								continue
							}
							acc += fp8Table[w[(hw*nope+d)*R+col]] * xr[d]
						}
						out[(m*H+h)*R+col] = float32(acc)
					}
				}
			}
		}
		return out
	}
	if e := onePartErr(run(0), ref, abs, M*H, R, R, uF16); e > 1 {
		t.Errorf("faithful transcription at %.3g of the one-part bound", e)
	}
	for bug, what := range map[int]string{1: "next head's weights", 2: "one k skipped", 3: "bf16 rounding"} {
		e := onePartErr(run(bug), ref, abs, M*H, R, R, uF16)
		t.Logf("%s: %.3g of the one-part bound", what, e)
		if e <= 1 {
			t.Errorf("%s passes the one-part bound (%.3g)", what, e)
		}
	}
}

// bf16Round32 rounds v to bf16 (nearest even) as a float32.
func bf16Round32(v float32) float32 {
	b := math.Float32bits(v)
	b += 0x7fff + (b>>16)&1
	return math.Float32frombits(b &^ 0xffff)
}

// TestKernelAbsorbP1Timing reports (never asserts) absorb_p1 against the
// three-part absorb_tc at the 8192-token prefill's DeepSeek-V3.2 shapes
// (128 heads, nope 128, vd 128, R 512), next to a device-to-device copy.
// TILERT_GPU_TIMING=1 only.
func TestKernelAbsorbP1Timing(t *testing.T) {
	needTiming(t)
	onGPU(t, func(c *cuda.Ctx, k *Set, a *allocs, r *rand.Rand) {
		if !k.AbsorbP1OK(0, 512) {
			t.Skip("absorb_p1 needs sm_89+")
		}
		s := c.Stream()
		add := timingTable(t, c, a, r, 1<<30, "copy d2d 1 GiB", "reference")
		const M, H, nope, R, vd, P = 8192, 128, 128, 512, 128, 64
		hs := nope + P
		q := a.raw(int64(4 * M * H * hs))
		fillRandom(c, r, q, int64(4*M*H*hs), "f32")
		uk, _ := devFP8(c, a, r, H*nope, R)
		uv, _ := devFP8(c, a, r, H*vd, R)
		uks, uvs := a.raw(int64(4*H*nope*R/128)), a.raw(int64(4*H*vd*R/128))
		fillRandom(c, r, uks, int64(4*H*nope*R/128), "f32")
		fillRandom(c, r, uvs, int64(4*H*vd*R/128), "f32")
		out := a.raw(int64(4 * M * H * R))
		x := a.raw(int64(4 * M * H * R))
		fillRandom(c, r, x, int64(4*M*H*R), "f32")
		vo := a.raw(int64(4 * M * H * vd))
		flop := 2 * float64(M) * H * nope * R
		bytesQ := float64(4*M*H*nope + H*nope*R + 4*M*H*R) // q's nope part, W_UK, out once
		bytesV := float64(4*M*H*R + H*vd*R + 4*M*H*vd)
		tcQ := medianUs(c, s, 1, 3, func() { chk(k.AbsorbQTC(s, out, q, uk, uks, M, H, nope, R, H*hs, hs)) })
		p1Q := medianUs(c, s, 2, 5, func() { chk(k.AbsorbQP1(s, out, q, uk, uks, M, H, nope, R, H*hs, hs)) })
		tcV := medianUs(c, s, 1, 3, func() { chk(k.AbsorbVTC(s, vo, x, uv, uvs, M, H, vd, R, H*vd)) })
		p1V := medianUs(c, s, 2, 5, func() { chk(k.AbsorbVP1(s, vo, x, uv, uvs, M, H, vd, R, H*vd)) })
		t.Logf("absorb q M=%d H=%d: absorb_tc %8.1f us (%.1f TFLOP/s), absorb_p1 %8.1f us (%.1f TFLOP/s)", M, H, tcQ, flop/tcQ/1e6, p1Q, flop/p1Q/1e6)
		t.Logf("absorb v M=%d H=%d: absorb_tc %8.1f us (%.1f TFLOP/s), absorb_p1 %8.1f us (%.1f TFLOP/s)", M, H, tcV, flop/tcV/1e6, p1V, flop/p1V/1e6)
		t.Logf("absorb q + v, one layer: absorb_tc %.1f us, absorb_p1 %.1f us (issue 10: <= 4000 us a layer, 8 ms for the bench's 2)", tcQ+tcV, p1Q+p1V)
		add(fmt.Sprintf("absorb_p1 q M=%d H=%d nope=%d R=%d", M, H, nope, R), bytesQ, p1Q, fmt.Sprintf("%.1f TFLOP/s (absorb_tc %.1f us)", flop/p1Q/1e6, tcQ))
		add(fmt.Sprintf("absorb_p1 v M=%d H=%d vd=%d R=%d", M, H, vd, R), bytesV, p1V, fmt.Sprintf("%.1f TFLOP/s (absorb_tc %.1f us)", flop/p1V/1e6, tcV))
		add(fmt.Sprintf("absorb_tc q M=%d H=%d nope=%d R=%d", M, H, nope, R), bytesQ, tcQ, "three fp16 parts")
		add(fmt.Sprintf("absorb_tc v M=%d H=%d vd=%d R=%d", M, H, vd, R), bytesV, tcV, "three fp16 parts")
	})
}
