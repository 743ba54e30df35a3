package kernels

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/tilert-go/tilert/cuda"
)

// TestKernelMoECombineSlotsRes checks moe_combine_slots_res (norm_fuse.cu)
// on fresh random inputs: x after it must be bit for bit what
// MoECombineSlots then AddRMSNorm leave in x (the engine's default pair),
// and within float32 bounds of the float64 reference x + resid + sum_j
// w_j y_j; with and without the shared expert's rows, 1..8 rows, odd N.
func TestKernelMoECombineSlotsRes(t *testing.T) {
	onGPU(t, func(c *cuda.Ctx, k *Set, a *allocs, r *rand.Rand) {
		s := c.Stream()
		for _, tc := range []struct {
			M, kk, N int
			resid    bool
		}{{1, 8, 7168, true}, {4, 8, 7168, true}, {8, 8, 7168, true}, {3, 6, 6144, false}, {2, 4, 1000, true}, {1, 1, 33, false}} {
			M, kk, N := tc.M, tc.kk, tc.N
			y := randF32(r, M*kk*N, 1)
			w := randF32(r, M*kk, 0.3)
			x := randF32(r, M*N, 2)
			nw := randF32(r, N, 1)
			yp, wp := a.up(y), a.up(w)
			var rv []float32
			rp := cuda.DevPtr(0)
			if tc.resid {
				rv = randF32(r, M*N, 1)
				rp = a.up(rv)
			}
			// The default pair on one copy of x.
			x1 := a.up(x)
			mo := a.poisoned(M * N)
			h := a.poisoned(M * N)
			chk(k.MoECombineSlots(s, mo, yp, wp, rp, M, kk, N))
			chk(k.AddRMSNorm(s, h, x1, mo, a.up(nw), M, N, N, N, N, 1e-6))
			// The fused kernel on another.
			x2 := a.up(x)
			chk(k.MoECombineSlotsRes(s, x2, yp, wp, rp, M, kk, N))
			got, want := downF32(c, x2, M*N), downF32(c, x1, M*N)
			ref := make([]float64, M*N)
			for m := range M {
				for n := range N {
					v := float64(x[m*N+n])
					if tc.resid {
						v += float64(rv[m*N+n])
					}
					for j := range kk {
						v += float64(w[m*kk+j]) * float64(y[(m*kk+j)*N+n])
					}
					ref[m*N+n] = v
				}
			}
			name := fmt.Sprintf("moe_combine_slots_res M=%d k=%d N=%d resid=%v", M, kk, N, tc.resid)
			record(t, name, relMetric, relErr(got, ref), boundF32)
			record(t, name+" vs moe_combine_slots + add_rmsnorm (x)", "differing outputs", float64(diffCount(got, want)), 0)
		}
		if err := k.MoECombineSlotsRes(s, 0, a.raw(64), a.raw(64), 0, 1, 1, 16); err == nil {
			t.Errorf("MoECombineSlotsRes accepted a null residual")
		}
	})
}

// TestKernelGemvBF16WideNorm checks gemv_bf16_wide_norm_r* (norm_fuse.cu)
// on fresh random inputs: h bit for bit RMSNorm's output and y bit for bit
// GemvBF16Wide of it (rows per block forced 1, 2, 4, 8 and the launcher's
// own), y within float32 bounds of float64; 1..4 rows, padded x rows, the
// router's shape (256 x 7168), GLM-5's (256 x 6144) and odd N.
func TestKernelGemvBF16WideNorm(t *testing.T) {
	defer func(f int) { forceGemvWideRows = f }(forceGemvWideRows)
	onGPU(t, func(c *cuda.Ctx, k *Set, a *allocs, r *rand.Rand) {
		s := c.Stream()
		for _, tc := range []struct{ N, K, M, pad int }{
			{256, 7168, 1, 0}, {256, 7168, 4, 4}, {256, 6144, 2, 0}, {77, 1024, 3, 8}, {160, 96, 1, 0},
		} {
			N, K, M := tc.N, tc.K, tc.M
			ldx := K + tc.pad
			x := randF32(r, M*ldx, 1)
			nw := randF32(r, K, 1)
			w := randBF16(r, N*K, 0.05)
			xp, nwp, wp := a.up(x), a.up(nw), a.up(w)
			for _, fr := range []int{0, 1, 2, 4, 8} {
				forceGemvWideRows = fr
				// The default pair: RMSNorm into h, the wide GEMV of h.
				h0, y0 := a.poisoned(M*K), a.poisoned(M*N)
				chk(k.RMSNorm(s, h0, xp, nwp, M, K, ldx, K, 1e-6))
				chk(k.GemvBF16Wide(s, y0, h0, wp, 0, N, K, M, K, N))
				h1, y1 := a.poisoned(M*K), a.poisoned(M*N)
				if !GemvBF16WideNormOK(xp, wp, nwp, K, M, ldx) {
					t.Errorf("N=%d K=%d M=%d: GemvBF16WideNormOK false", N, K, M)
				}
				chk(k.GemvBF16WideNorm(s, y1, h1, xp, wp, nwp, N, K, M, ldx, N, K, 1e-6))
				hGot, yGot := downF32(c, h1, M*K), downF32(c, y1, M*N)
				xn := make([]float32, M*K)
				for m := range M {
					var ss float64
					for i := range K {
						v := float64(x[m*ldx+i])
						ss += v * v
					}
					inv := 1 / math.Sqrt(ss/float64(K)+1e-6)
					for i := range K {
						xn[m*K+i] = float32(float64(x[m*ldx+i]) * inv * float64(nw[i]))
					}
				}
				ref := refGemv(func(n, kk int) float64 { return bf16ToF64(w[n*K+kk]) }, xn, nil, N, K, M, K, N)
				name := fmt.Sprintf("gemv_bf16_wide_norm N=%d K=%d M=%d ldx=%d rows/block=%d", N, K, M, ldx, fr)
				record(t, name, relMetric, relErr(yGot, ref), boundF32)
				record(t, name+" y vs rmsnorm + gemv_bf16_wide", "differing outputs", float64(diffCount(yGot, downF32(c, y0, M*N))), 0)
				record(t, name+" h vs rmsnorm", "differing outputs", float64(diffCount(hGot, downF32(c, h0, M*K))), 0)
			}
		}
		forceGemvWideRows = 0
		if err := k.GemvBF16WideNorm(s, a.raw(64), a.raw(64), a.raw(64), a.raw(64), a.raw(64), 16, 16, 5, 16, 16, 16, 1e-6); err == nil {
			t.Errorf("GemvBF16WideNorm accepted 5 rows")
		}
	})
}

// TestKernelTimingNormFuse times what TILERT_GPU_NORM_FUSE changes in a
// DeepSeek-V3.2 layer (weights cold, inside a CUDA graph as the engine
// replays a step; 1 and 4 rows), reported, never asserted:
//   - in: the MoE combine, the closing add_rmsnorm and the next layer's
//     grouped input launch (q_a, kv_a, wk, weights_proj over the normed
//     row: the default, 3 launches) against the residual combine and the
//     grouped launch norming the residual in its prologue, staged
//     (gemv_group_sn: the switch) and the plain prologue (2 launches each);
//   - qb: rmsnorm of q_a then q_b + wq_b grouped (TILERT_GPU_GROUP=3), the
//     grouped launch with the plain prologue (=2) and with the staged one
//     (=2 with the switch).
func TestKernelTimingNormFuse(t *testing.T) {
	needTiming(t)
	onGPU(t, func(c *cuda.Ctx, k *Set, a *allocs, r *rand.Rand) {
		add := timingTable(t, c, a, r, 1<<30, "normfuse: device-to-device copy 1 GiB (read+write)", "reference")
		type seg struct {
			N    int
			bf16 bool
		}
		const H, slots = 7168, 8
		run := func(what string, K int, moe bool, segs []seg) {
			var bytes int64
			for _, sg := range segs {
				bytes += int64(sg.N*K) * int64(1+b2i(sg.bf16))
			}
			nc := coldCopies(bytes)
			ws := make([][]cuda.DevPtr, len(segs))
			ss := make([][]cuda.DevPtr, len(segs))
			ys := make([]cuda.DevPtr, len(segs))
			for i, sg := range segs {
				if sg.bf16 {
					ws[i] = devBF16s(c, a, r, nc, sg.N, K)
					ss[i] = make([]cuda.DevPtr, nc)
				} else {
					ws[i], ss[i] = devFP8s(c, a, r, nc, sg.N, K)
				}
				ys[i] = a.raw(int64(4 * MaxTileM * sg.N))
			}
			x := a.up(randF32(r, MaxTileM*K, 1))
			xn := a.raw(int64(4 * MaxTileM * K))
			nw := a.up(randF32(r, K, 1))
			ey := a.up(randF32(r, MaxTileM*(slots+1)*K, 1e-3))
			ew := a.up(randF32(r, MaxTileM*slots, 0.1))
			mo := a.raw(int64(4 * MaxTileM * K))
			gs := func(i int) []GroupSeg {
				g := make([]GroupSeg, len(segs))
				for j, sg := range segs {
					g[j] = GroupSeg{W: ws[j][i%nc], S: ss[j][i%nc], Y: ys[j], N: sg.N, LdY: sg.N, BF16: sg.bf16}
				}
				return g
			}
			before := func(s cuda.Stream, i, M int) {
				if moe {
					chk(k.MoECombineSlots(s, mo, ey, ew, ey.Add(int64(4*M*slots*K)), M, slots, K))
					chk(k.AddRMSNorm(s, xn, x, mo, nw, M, K, K, K, K, 1e-6))
				} else {
					chk(k.RMSNorm(s, xn, x, nw, M, K, K, K, 1e-6))
				}
				chk(k.GemvGroup(s, xn, K, M, K, gs(i), GroupNorm{}))
			}
			fused := func(staged bool) func(s cuda.Stream, i, M int) {
				return func(s cuda.Stream, i, M int) {
					if moe {
						chk(k.MoECombineSlotsRes(s, x, ey, ew, ey.Add(int64(4*M*slots*K)), M, slots, K))
					}
					chk(k.GemvGroup(s, x, K, M, K, gs(i), GroupNorm{W: nw, Eps: 1e-6, Staged: staged}))
				}
			}
			for _, M := range []int{1, 4} {
				b := float64(bytes) + float64(4*M*K)
				old := groupGraphUs(c, 2*nc, 11, func(s cuda.Stream, i int) { before(s, i, M) })
				add(fmtName("%s default M=%d cold, graph", what, M), b, old, "")
				if !moe {
					// The engine's default for q_b and wq_b: rmsnorm, then
					// each as its own tile GEMV (the row above: grouped, =3).
					tiles := groupGraphUs(c, 2*nc, 11, func(s cuda.Stream, i int) {
						chk(k.RMSNorm(s, xn, x, nw, M, K, K, K, 1e-6))
						for j, sg := range segs {
							chk(k.GemvFP8Tile(s, ys[j], xn, ws[j][i%nc], ss[j][i%nc], 0, sg.N, K, M, K, sg.N))
						}
					})
					add(fmtName("%s rmsnorm + tile GEMVs M=%d cold, graph", what, M), b, tiles, fmtName("%.2fx grouped", old/tiles))
				}
				for _, staged := range []bool{true, false} {
					f := fused(staged)
					us := groupGraphUs(c, 2*nc, 11, func(s cuda.Stream, i int) { f(s, i, M) })
					add(fmtName("%s fused staged=%v M=%d cold, graph", what, staged, M), b, us, fmtName("%.2fx default", old/us))
				}
			}
		}
		run("in (combine, add+norm, q_a kv_a wk wproj)", H, true, []seg{{1536, false}, {576, false}, {128, false}, {64, true}})
		// post: o_proj into scratch, add_rmsnorm, the router's wide GEMV (the
		// default) against o_proj adding into the residual and the router's
		// normed launch (=2).
		{
			const NO, KO, E = 7168, 16384, 256
			nc := coldCopies(int64(NO*KO + 2*E*H))
			wo, so := devFP8s(c, a, r, nc, NO, KO)
			wr := devBF16s(c, a, r, nc, E, H)
			ao := a.up(randF32(r, 4*KO, 1))
			x := a.up(randF32(r, 4*H, 1))
			tmp, h, lg := a.raw(int64(4*4*H)), a.raw(int64(4*4*H)), a.raw(int64(4*4*E))
			nw := a.up(randF32(r, H, 1))
			for _, M := range []int{1, 4} {
				b := float64(NO*KO+2*E*H) + float64(4*M*(KO+H))
				old := groupGraphUs(c, 2*nc, 11, func(s cuda.Stream, i int) {
					chk(k.GemvFP8Tile(s, tmp, ao, wo[i%nc], so[i%nc], 0, NO, KO, M, KO, H))
					chk(k.AddRMSNorm(s, h, x, tmp, nw, M, H, H, H, H, 1e-6))
					chk(k.GemvBF16Wide(s, lg, h, wr[i%nc], 0, E, H, M, H, E))
				})
				add(fmtName("post (o_proj, add+norm, router) default M=%d cold, graph", M), b, old, "tile o_proj; M=4 runs the MMA one in the engine")
				us := groupGraphUs(c, 2*nc, 11, func(s cuda.Stream, i int) {
					chk(k.GemvFP8Tile(s, x, ao, wo[i%nc], so[i%nc], x, NO, KO, M, KO, H))
					chk(k.GemvBF16WideNorm(s, lg, h, x, wr[i%nc], nw, E, H, M, H, E, H, 1e-6))
				})
				add(fmtName("post o_proj+resid, router wide_norm M=%d cold, graph", M), b, us, fmtName("%.2fx default", old/us))
			}
		}
		run("qb (rmsnorm, q_b + wq_b grouped)", 1536, false, []seg{{24576, false}, {8192, false}})
	})
}
