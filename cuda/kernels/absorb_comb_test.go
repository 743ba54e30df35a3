package kernels

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/tilert-go/tilert/cuda"
)

// TestKernelAbsorbVComb: absorb_v_comb (one row's split-MLA merge and W_UV
// product in one launch, cu/absorb/absorb_comb.cu) on fresh random
// partials and weights, bit for bit against the two launches it replaces
// (mla_combine_wide, then absorb_v_fast at its rule's rows a warp): the
// product and the merged latent rows (xout), with empty ranges (max -inf)
// among the partials and a head whose ranges are all empty; against
// float64; a repeat bit for bit; bad arguments refused. Shapes:
// DeepSeek-V3.2 (128 heads, vd 128) at mla_decode_wg2's 32 splits and
// others, GLM-5 (64, vd 256) at tcf2's 64, the TP-8 shard (16), odd ones.
func TestKernelAbsorbVComb(t *testing.T) {
	onGPU(t, func(c *cuda.Ctx, k *Set, a *allocs, r *rand.Rand) {
		if err := k.AbsorbFastSupported(); err != nil {
			t.Skipf("absorb module: %v", err)
		}
		s := c.Stream()
		const R = MLALatentDim
		for _, sh := range []struct{ H, vd, ns int }{{128, 128, 32}, {128, 128, 2}, {128, 128, 17}, {64, 256, 64}, {64, 256, 32},
			{16, 128, 64}, {5, 48, 3}, {3, 200, 256}} {
			H, vd, ns := sh.H, sh.vd, sh.ns
			tag := fmt.Sprintf("H=%d vd=%d nsplit=%d", H, vd, ns)
			po := randF32(r, H*ns*R, 3)
			ml := make([]float32, 2*H*ns)
			for i := range H * ns {
				ml[2*i] = float32(r.NormFloat64() * 4)
				ml[2*i+1] = float32(1 + 60*r.Float64())
				if r.IntN(7) == 0 || i/ns == H-1 && H > 3 { // empty ranges; the last head all empty
					ml[2*i], ml[2*i+1] = float32(math.Inf(-1)), 0
					for j := range R {
						po[i*R+j] = 0
					}
				}
			}
			pop, mlp := a.up(po), a.up(ml)
			uvp, uvs, uv := randFP8Rows(r, a, H*vd, R)
			// The two launches.
			x0 := a.poisoned(H * R)
			chk(k.launch(mlaCombineFor(c.Info().SMs, H), cuda.D1(H), cuda.D1(128), 0, s, pop, mlp, ns, x0, cuda.DevPtr(0)))
			o0 := a.poisoned(H * vd)
			chk(k.AbsorbVFast(s, o0, x0, uvp, uvs, H, vd, R, 0))
			// One launch.
			o1, x1 := a.poisoned(H*vd), a.poisoned(H*R)
			chk(k.AbsorbVComb(s, o1, x1, pop, mlp, uvp, uvs, ns, H, vd, R))
			got, gotX := downF32(c, o1, H*vd), downF32(c, x1, H*R)
			record(t, "absorb_v_comb == mla_combine_wide + absorb_v_fast "+tag, "differing values",
				float64(diffF32Bits(got, downF32(c, o0, H*vd))+diffF32Bits(gotX, downF32(c, x0, H*R))), 0)
			// float64: merge, then W_UV.
			ref := make([]float64, 0, H*vd)
			for h := range H {
				m := math.Inf(-1)
				for z := range ns {
					m = math.Max(m, float64(ml[2*(h*ns+z)]))
				}
				x := make([]float64, R)
				var l float64
				for z := range ns {
					i := h*ns + z
					if math.IsInf(float64(ml[2*i]), -1) {
						continue
					}
					w := math.Exp(float64(ml[2*i]) - m)
					l += w * float64(ml[2*i+1])
					for j := range R {
						x[j] += w * float64(po[i*R+j])
					}
				}
				for v := range vd {
					var acc float64
					if l > 0 {
						for j := range R {
							acc += uv(h*vd+v, j) * x[j] / l
						}
					}
					ref = append(ref, acc)
				}
			}
			record(t, "absorb_v_comb vs float64 "+tag, relMetric, relErr(got, ref), boundF32)
			o2 := a.poisoned(H * vd)
			chk(k.AbsorbVComb(s, o2, 0, pop, mlp, uvp, uvs, ns, H, vd, R))
			record(t, "absorb_v_comb repeat (no xout) "+tag, "differing values", float64(diffF32Bits(got, downF32(c, o2, H*vd))), 0)
		}
		p := a.raw(64)
		for _, bad := range []struct{ H, vd, R, ns int }{{0, 128, 512, 32}, {128, 0, 512, 32}, {128, 128, 256, 32}, {128, 128, 512, 1}, {128, 128, 512, 257}} {
			if err := k.AbsorbVComb(s, p, 0, p, p, p, p, bad.ns, bad.H, bad.vd, bad.R); err == nil {
				t.Errorf("AbsorbVComb accepted H=%d vd=%d R=%d nsplit=%d", bad.H, bad.vd, bad.R, bad.ns)
			}
		}
		if err := k.AbsorbVComb(s, p, 0, 0, p, p, p, 32, 128, 128, 512); err == nil {
			t.Error("AbsorbVComb accepted no partials")
		}
	})
}

// TestKernelTimingAbsorbVComb: graph-timed, weights cold (rotating sets),
// one row: mla_combine_wide + absorb_v_fast against absorb_v_comb at
// DeepSeek-V3.2's 128 heads x 32 splits (mla_decode_wg2 at one row) and
// GLM-5's 64 heads x 64 splits (tcf2).
func TestKernelTimingAbsorbVComb(t *testing.T) {
	needTiming(t)
	onGPU(t, func(c *cuda.Ctx, k *Set, a *allocs, r *rand.Rand) {
		if err := k.AbsorbFastSupported(); err != nil {
			t.Skipf("absorb module: %v", err)
		}
		s := c.Stream()
		add := timingTable(t, c, a, r, 256<<20, "device-to-device copy 256 MiB (read+write)", "reference of this table")
		const R, sets = MLALatentDim, 8
		for _, sh := range []struct{ H, vd, ns int }{{128, 128, 32}, {64, 256, 64}} {
			H, vd, ns := sh.H, sh.vd, sh.ns
			var pop, mlp, uvp, uvs, x, o [sets]cuda.DevPtr
			for i := range sets {
				ml := make([]float32, 2*H*ns)
				for j := range H * ns {
					ml[2*j], ml[2*j+1] = float32(r.NormFloat64()), 10
				}
				pop[i], mlp[i] = a.up(randF32(r, H*ns*R, 1)), a.up(ml)
				uvp[i], uvs[i], _ = randFP8Rows(r, a, H*vd, R)
				x[i], o[i] = a.raw(int64(4*H*R)), a.raw(int64(4*H*vd))
			}
			nb := float64(H*vd*R + 4*H*ns*R)
			us := graphUsRot(c, s, sets, 15, func(i int) {
				chk(k.launch(mlaCombineFor(c.Info().SMs, H), cuda.D1(H), cuda.D1(128), 0, s, pop[i], mlp[i], ns, x[i], cuda.DevPtr(0)))
				chk(k.AbsorbVFast(s, o[i], x[i], uvp[i], uvs[i], H, vd, R, 0))
			})
			add(fmtName("graph: mla_combine_wide + absorb_v_fast H=%d vd=%d split=%d", H, vd, ns), nb, us, "two launches")
			us = graphUsRot(c, s, sets, 15, func(i int) {
				chk(k.AbsorbVComb(s, o[i], 0, pop[i], mlp[i], uvp[i], uvs[i], ns, H, vd, R))
			})
			add(fmtName("graph: absorb_v_comb H=%d vd=%d split=%d", H, vd, ns), nb, us, "one launch")
		}
	})
}
