package kernels

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/tilert-go/tilert/cuda"
	"github.com/tilert-go/tilert/numeric"
)

// refFoldPairs is router_fold_a / _m transcribed: A = float32(W_r) * w
// (float32 products), M = A W_o summed in float64 over H ascending (a
// float32 x float32 product is exact in float64, so the kernel's fma and
// this multiply-add round the same), each stored as hi/lo bf16 pairs. wo
// is W_o as the kernel reads it (fp8 value times its block scale in
// float32, or bf16 / float32).
func refFoldPairs(wr []float32, w []float32, wo []float32, E, H, K int) (a2, m2 []uint16) {
	a := make([]float32, E*H)
	for j := range E {
		for i := range H {
			a[j*H+i] = wr[j*H+i] * w[i]
		}
	}
	acc := make([]float64, E*K)
	for i := range H {
		row := wo[i*K : (i+1)*K]
		for j := range E {
			aj, dst := float64(a[j*H+i]), acc[j*K:(j+1)*K]
			for k, v := range row {
				dst[k] += aj * float64(v)
			}
		}
	}
	m := make([]float32, E*K)
	for i, v := range acc {
		m[i] = float32(v)
	}
	split := func(v []float32, n int) []uint16 {
		p := make([]uint16, 2*E*n)
		for j := range E {
			for c := range n {
				p[j*n+c], p[(E+j)*n+c] = numeric.BF16Pair(v[j*n+c])
			}
		}
		return p
	}
	return split(a, H), split(m, K)
}

// TestKernelRouterFold: router_fold_a and router_fold_m against their Go
// transcription bit for bit, on fresh random layers: the router bf16 or
// float32, o_proj fp8 (block scales, partial blocks), bf16 or float32.
func TestKernelRouterFold(t *testing.T) {
	onGPU(t, func(c *cuda.Ctx, k *Set, a *allocs, r *rand.Rand) {
		s := c.Stream()
		for _, cs := range []struct {
			E, H, K        int
			wrKind, woKind FoldKind
		}{
			{256, 1024, 2048, FoldBF16, FoldFP8},
			{16, 192, 256, FoldBF16, FoldFP8},
			{40, 300, 500, FoldF32, FoldFP8},
			{64, 256, 130, FoldBF16, FoldBF16},
			{32, 160, 384, FoldF32, FoldF32},
		} {
			E, H, K := cs.E, cs.H, cs.K
			wr := make([]float32, E*H)
			var wrP cuda.DevPtr
			if cs.wrKind == FoldBF16 {
				u := randBF16(r, E*H, 0.05)
				for i, v := range u {
					wr[i] = numeric.BF16ToFloat32(v)
				}
				wrP = a.up(u)
			} else {
				wr = randF32(r, E*H, 0.05)
				wrP = a.up(wr)
			}
			w := randF32(r, H, 0.2)
			for i := range w {
				w[i] += 1
			}
			wo := make([]float32, H*K)
			var woP, woS cuda.DevPtr
			switch cs.woKind {
			case FoldFP8:
				q := randFP8(r, H*K)
				kb := cdiv(K, 128)
				sc := randF32(r, cdiv(H, 128)*kb, 0.001)
				for i := range sc {
					sc[i] = float32(math.Abs(float64(sc[i]))) + 0.0005
				}
				for i := range wo {
					wo[i] = numeric.FP8E4M3ToFloat32(q[i]) * sc[(i/K/128)*kb+(i%K)/128]
				}
				woP, woS = a.up(q), a.up(sc)
			case FoldBF16:
				u := randBF16(r, H*K, 0.02)
				for i, v := range u {
					wo[i] = numeric.BF16ToFloat32(v)
				}
				woP = a.up(u)
			default:
				wo = randF32(r, H*K, 0.02)
				woP = a.up(wo)
			}
			sa, pa, pm := a.poisoned(E*H), a.poisoned(E*H), a.poisoned(E*K)
			chk(k.RouterFoldA(s, sa, pa, wrP, cs.wrKind, a.up(w), E, H))
			chk(k.RouterFoldM(s, pm, sa, woP, woS, cs.woKind, E, H, K))
			ga, gm := make([]uint16, 2*E*H), make([]uint16, 2*E*K)
			chk(c.Download(ga, pa))
			chk(c.Download(gm, pm))
			ra, rm := refFoldPairs(wr, w, wo, E, H, K)
			bad := 0
			for i := range ra {
				if ga[i] != ra[i] {
					bad++
				}
			}
			for i := range rm {
				if gm[i] != rm[i] {
					bad++
				}
			}
			record(t, fmt.Sprintf("router_fold E=%d H=%d K=%d router kind %d o_proj kind %d vs Go", E, H, K, cs.wrKind, cs.woKind),
				"mismatched bf16 values", float64(bad), 0)
		}
	})
}

// TestKernelAddRMSNormRoute: add_rmsnorm_route's x and y bit for bit
// add_rmsnorm_reg's on the same inputs, and its picks those of the
// reference routing (refMoERoute) of ((r1 + r1') + (r2 + r2')) / rms taken
// in float64 from the kernel's own x (float32 near-ties, gap < 1e-5, not
// compared), the weights within float32 rounding.
func TestKernelAddRMSNormRoute(t *testing.T) {
	onGPU(t, func(c *cuda.Ctx, k *Set, a *allocs, r *rand.Rand) {
		s := c.Stream()
		for _, cs := range []struct {
			D, E, K, ngroup, tkg int
			norm                 bool
		}{
			{7168, 256, 8, 8, 4, true}, // DeepSeek-V3.2
			{6144, 256, 8, 1, 1, true}, // GLM-5
			{192, 16, 4, 4, 2, true},   // the tiny presets
			{256, 16, 4, 1, 1, false},
			{1000, 96, 6, 3, 2, true},
		} {
			if !AddRMSNormRouteFits(cs.D, cs.E) {
				t.Fatalf("D=%d E=%d: the fused launch does not fit", cs.D, cs.E)
			}
			for _, M := range []int{1, 2, 4} {
				D, E := cs.D, cs.E
				x0, b, w := randF32(r, M*D, 1), a.up(randF32(r, M*D, 1)), a.up(randF32(r, D, 1))
				p1, p2 := randF32(r, M*2*E, 1), randF32(r, M*2*E, 1)
				bias := randF32(r, E, 0.1)
				// The two launches' norm.
				xr, yr := a.up(x0), a.poisoned(M*D)
				chk(k.AddRMSNorm(s, yr, xr, b, w, M, D, D, D, D, 1e-6))
				// The fused launch.
				xf, yf := a.up(x0), a.poisoned(M*D)
				ip, wp := a.poisoned(M*cs.K), a.poisoned(M*cs.K)
				chk(k.AddRMSNormRoute(s, yf, xf, b, w, M, D, 1e-6, a.up(p1), a.up(p2), a.up(bias), ip, wp, E, cs.K, cs.ngroup, cs.tkg, cs.norm, 2.5))
				xs, ys := downF32(c, xf, M*D), downF32(c, yf, M*D)
				tag := fmt.Sprintf("D=%d E=%d K=%d groups %d/%d M=%d", D, E, cs.K, cs.ngroup, cs.tkg, M)
				record(t, "add_rmsnorm_route x, y vs add_rmsnorm_reg "+tag, "mismatched values",
					float64(diffF32Bits(xs, downF32(c, xr, M*D))+diffF32Bits(ys, downF32(c, yr, M*D))), 0)
				// The reference logits: ((r1 + r1') + (r2 + r2')) / rms in
				// float64, rms from the kernel's own x.
				checkRoutes(t, "add_rmsnorm_route "+tag, M, E, cs.K, cs.ngroup, cs.tkg, cs.norm, 2.5, bias, func(row int) []float32 {
					var ss float64
					for _, v := range xs[row*D : (row+1)*D] {
						ss += float64(v) * float64(v)
					}
					inv := 1 / math.Sqrt(ss/float64(D)+1e-6)
					q1, q2 := p1[row*2*E:], p2[row*2*E:]
					lg := make([]float32, E)
					for j := range E {
						lg[j] = float32((float64(q1[j]+q1[E+j]) + float64(q2[j]+q2[E+j])) * inv)
					}
					return lg
				}, downI32(c, ip, M*cs.K), downF32(c, wp, M*cs.K))
			}
		}
	})
}

// TestKernelTimingRouterFold (TILERT_GPU_TIMING=1) graph-times what the
// fold changes at one row: the chain after o_proj (add_rmsnorm_reg, the
// router GEMV, moe_route_rank: three launches) against add_rmsnorm_route
// alone, and the fold's two GEMVs of hi/lo bf16 pairs alone (r1: [512][H],
// r2: [512][16384]), at DeepSeek-V3.2 and GLM-5 dims.
func TestKernelTimingRouterFold(t *testing.T) {
	needTiming(t)
	onGPU(t, func(c *cuda.Ctx, k *Set, a *allocs, r *rand.Rand) {
		s := c.Stream()
		add := timingTable(t, c, a, r, 256<<20, "router fold: device-to-device copy 256 MiB (read+write)", "reference of this table")
		const E, topk, V = 256, 8, 16384
		for _, m := range []struct {
			name       string
			D, ng, tkg int
		}{{"DeepSeek-V3.2", 7168, 8, 4}, {"GLM-5", 6144, 1, 1}} {
			D := m.D
			x, b, y, w := a.up(randF32(r, D, 1)), a.up(randF32(r, D, 1)), a.raw(int64(4*D)), a.up(randF32(r, D, 1))
			wr := a.up(randBF16(r, E*D, 0.05))
			lg, bias := a.raw(int64(4*E)), a.up(randF32(r, E, 0.1))
			ids, wts := a.raw(int64(4*topk)), a.raw(int64(4*topk))
			add(fmtName("%s: add_rmsnorm_reg + router gemv_bf16_wide + moe_route_rank (3 launches)", m.name), float64(2*E*D+16*D),
				graphUs(c, s, 20, func() {
					chk(k.AddRMSNorm(s, y, x, b, w, 1, D, D, D, D, 1e-6))
					chk(k.GemvBF16Wide(s, lg, y, wr, 0, E, D, 1, D, E))
					chk(k.MoERoute(s, ids, wts, lg, bias, 1, E, topk, m.ng, m.tkg, true, 2.5))
				}), "")
			p1, p2 := a.up(randF32(r, 2*E, 1)), a.up(randF32(r, 2*E, 1))
			add(fmtName("%s: add_rmsnorm_route (1 launch)", m.name), float64(16*D+16*E),
				graphUs(c, s, 20, func() {
					chk(k.AddRMSNormRoute(s, y, x, b, w, 1, D, 1e-6, p1, p2, bias, ids, wts, E, topk, m.ng, m.tkg, true, 2.5))
				}), "")
			a2, xr := a.up(randBF16(r, 2*E*D, 0.05)), a.up(randF32(r, D, 1))
			m2, v := a.up(randBF16(r, 2*E*V, 0.01)), a.up(randF32(r, V, 1))
			add(fmtName("%s: r1 = A2 x, [512][%d] bf16 pairs", m.name, D), float64(2*2*E*D),
				graphUs(c, s, 20, func() { chk(k.GemvBF16Wide(s, p1, xr, a2, 0, 2*E, D, 1, D, 2*E)) }), "")
			add(fmtName("%s: r2 = M2 v, [512][%d] bf16 pairs", m.name, V), float64(2*2*E*V),
				graphUs(c, s, 20, func() { chk(k.GemvBF16Wide(s, p2, v, m2, 0, 2*E, V, 1, V, 2*E)) }), "")
		}
	})
}
