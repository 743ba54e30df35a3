package kernels

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/tilert-go/tilert/cuda"
)

// Checks of the register-staged norms (rmsnorm_reg, add_rmsnorm_reg) and the
// rank-based router (moe_route_rank) against the loop kernels they replace
// (smallFast off), bit for bit on fresh random inputs; the loop kernels have
// their own checks against CPU references (TestKernelOps), which run the new
// kernels too while smallFast is on (the default).

// withSmall runs f with smallFast set to on and restores it.
func withSmall(on bool, f func()) {
	old := smallFast
	smallFast = on
	defer func() { smallFast = old }()
	f()
}

// quantised draws n values from only a few levels, so that the router sees
// ties (equal c within and across groups, equal group scores).
func quantised(r *rand.Rand, n, levels int) []float32 {
	x := make([]float32, n)
	for i := range x {
		x[i] = float32(r.IntN(levels)-levels/2) * 0.25
	}
	return x
}

func TestKernelSmallFast(t *testing.T) {
	onGPU(t, func(c *cuda.Ctx, k *Set, a *allocs, r *rand.Rand) {
		s := c.Stream()
		for _, D := range []int{7168, 6144, 1536, 512, 128, 1000, 33, 8192} {
			for _, M := range []int{1, 2, 4} {
				ldx, ldb, ldy := D+4*(M%2), D, D+8
				x0 := randF32(r, M*ldx, 3)
				b := a.up(randF32(r, M*ldb, 1))
				w := a.up(randF32(r, D, 1))
				var outs [2][]float32
				var xs [2][]float32
				var inplace [2][]float32
				for i, on := range []bool{false, true} {
					withSmall(on, func() {
						x, y := a.up(x0), a.poisoned(M*ldy)
						chk(k.AddRMSNorm(s, y, x, b, w, M, D, ldx, ldb, ldy, 1e-6))
						outs[i], xs[i] = downF32(c, y, M*ldy), downF32(c, x, M*ldx)
						// rmsnorm in place (y aliases x), as attnProj norms q_a
						xi := a.up(x0)
						chk(k.RMSNorm(s, xi, xi, w, M, D, ldx, ldx, 1e-6))
						inplace[i] = downF32(c, xi, M*ldx)
					})
				}
				tag := fmt.Sprintf("D=%d M=%d", D, M)
				record(t, "add_rmsnorm_reg vs add_rmsnorm "+tag, "mismatched values",
					float64(diffF32Bits(outs[0], outs[1])+diffF32Bits(xs[0], xs[1])), 0)
				record(t, "rmsnorm_reg in place vs rmsnorm "+tag, "mismatched values", float64(diffF32Bits(inplace[0], inplace[1])), 0)
			}
		}
		for _, cs := range []struct {
			E, K, ngroup, topkGroup int
			norm, bias              bool
			levels                  int // 0: normal logits; else that many levels (ties)
		}{
			{256, 8, 8, 4, true, true, 0}, // DeepSeek-V3.2
			{256, 8, 8, 4, true, true, 5},
			{256, 8, 8, 4, false, false, 3},
			{256, 8, 1, 1, true, true, 0}, // GLM-5
			{256, 8, 1, 1, true, false, 4},
			{64, 6, 4, 2, false, true, 0}, // groups of 16: the loop path
			{160, 8, 4, 2, true, true, 0},
			{160, 8, 4, 2, true, false, 3},
			{32, 6, 8, 1, true, true, 0}, // 4 kept experts < K: dropped ones chosen
			{96, 8, 3, 2, true, true, 2},
			{40, 40, 1, 1, true, true, 0},
			{1024, 64, 32, 4, true, true, 0},
		} {
			for _, M := range []int{1, 3, 8} {
				var lgv []float32
				if cs.levels > 0 {
					lgv = quantised(r, M*cs.E, cs.levels)
				} else {
					lgv = randF32(r, M*cs.E, 2)
				}
				lg := a.up(lgv)
				bias := cuda.DevPtr(0)
				if cs.bias {
					bias = a.up(randF32(r, cs.E, 0.1))
					if cs.levels > 0 {
						bias = a.up(quantised(r, cs.E, 2))
					}
				}
				// moe_route, moe_route_rank (RouteSort off), moe_route_sort.
				var ids [3][]int32
				var wts [3][]float32
				for i, on := range []bool{false, true, true} {
					withSmall(on, func() {
						defer func(v bool) { RouteSort = v }(RouteSort)
						RouteSort = i == 2
						idx, wt := a.poisoned(M*cs.K), a.poisoned(M*cs.K)
						chk(k.MoERoute(s, idx, wt, lg, bias, M, cs.E, cs.K, cs.ngroup, cs.topkGroup, cs.norm, 2.5))
						ids[i], wts[i] = downI32(c, idx, M*cs.K), downF32(c, wt, M*cs.K)
					})
				}
				for v, name := range []string{"", "moe_route_rank", "moe_route_sort"} {
					if v == 0 {
						continue
					}
					bad := diffF32Bits(wts[0], wts[v])
					for i := range ids[0] {
						if ids[0][i] != ids[v][i] {
							bad++
						}
					}
					record(t, fmt.Sprintf("%s vs moe_route E=%d K=%d groups %d/%d norm=%v bias=%v levels=%d M=%d",
						name, cs.E, cs.K, cs.ngroup, cs.topkGroup, cs.norm, cs.bias, cs.levels, M), "mismatched values", float64(bad), 0)
				}
			}
		}
	})
}

// TestKernelSmallTiming graph-times the loop kernels against the new ones at
// DeepSeek-V3.2 dims (20 launches a graph, the decode step's situation).
func TestKernelSmallTiming(t *testing.T) {
	needTiming(t)
	onGPU(t, func(c *cuda.Ctx, k *Set, a *allocs, r *rand.Rand) {
		s := c.Stream()
		add := timingTable(t, c, a, r, 256<<20, "small: device-to-device copy 256 MiB (read+write)", "reference of this table")
		both := func(name string, bytes float64, f func()) {
			for _, on := range []bool{false, true} {
				v := "old"
				if on {
					v = "new"
				}
				withSmall(on, func() { add(name+" graph "+v, bytes, graphUs(c, s, 20, f), "") })
			}
		}
		for _, M := range []int{1, 4} {
			for _, D := range []int{7168, 1536} {
				x, b, y, w := a.up(randF32(r, M*D, 1)), a.up(randF32(r, M*D, 1)), a.raw(int64(4*M*D)), a.up(randF32(r, D, 1))
				both(fmtName("add_rmsnorm D=%d M=%d", D, M), float64(4*D*(4*M+1)), func() { chk(k.AddRMSNorm(s, y, x, b, w, M, D, D, D, D, 1e-6)) })
				both(fmtName("rmsnorm D=%d M=%d", D, M), float64(4*D*(2*M+1)), func() { chk(k.RMSNorm(s, y, x, w, M, D, D, D, 1e-6)) })
			}
			const E, topk = 256, 8
			lg, bias := a.up(randF32(r, M*E, 2)), a.up(randF32(r, E, 0.1))
			ids, wts := a.raw(int64(4*M*topk)), a.raw(int64(4*M*topk))
			both(fmtName("moe_route DeepSeek 256 groups 8/4 M=%d", M), float64(4*M*E), func() {
				chk(k.MoERoute(s, ids, wts, lg, bias, M, E, topk, 8, 4, true, 2.5))
			})
			both(fmtName("moe_route GLM-5 256 plain M=%d", M), float64(4*M*E), func() {
				chk(k.MoERoute(s, ids, wts, lg, bias, M, E, topk, 1, 1, true, 2.5))
			})
			for _, g := range [][2]int{{8, 4}, {1, 1}} {
				for _, on := range []bool{false, true} {
					old := RouteSort
					RouteSort = on
					add(fmtName("moe_route groups %d/%d M=%d graph, moe_route_sort %v", g[0], g[1], M, on), float64(4*M*E), graphUs(c, s, 20, func() {
						chk(k.MoERoute(s, ids, wts, lg, bias, M, E, topk, g[0], g[1], true, 2.5))
					}), "")
					RouteSort = old
				}
			}
			const K = 7168
			w := a.up(randBF16(r, E*K, 0.05))
			x := a.up(randF32(r, M*K, 1))
			rb := float64(2*E*K + 4*M*K + 4*M*E)
			both(fmtName("router gemv_bf16_wide + moe_route (2 launches) M=%d", M), rb, func() {
				chk(k.GemvBF16Wide(s, lg, x, w, 0, E, K, M, K, E))
				chk(k.MoERoute(s, ids, wts, lg, bias, M, E, topk, 8, 4, true, 2.5))
			})
			const D = 7168
			y := a.up(randF32(r, M*topk*D, 1))
			ew := a.up(randF32(r, M*topk, 0.3))
			res := a.up(randF32(r, M*D, 1))
			nw := a.up(randF32(r, D, 1))
			xr, out, tmp := a.up(randF32(r, M*D, 1)), a.raw(int64(4*M*D)), a.raw(int64(4*M*D))
			both(fmtName("moe_combine_slots + add_rmsnorm (2 launches) M=%d", M), float64(4*M*D*(topk+5)), func() {
				chk(k.MoECombineSlots(s, tmp, y, ew, res, M, topk, D))
				chk(k.AddRMSNorm(s, out, xr, tmp, nw, M, D, D, D, D, 1e-6))
			})
		}
	})
}

// TestKernelSmallGroupTiming graph-times the grouped GEMVs with a norm
// prologue, weights cold, 1 row: q_b + indexer wq_b over q_a (K = 1536,
// TILERT_GPU_GROUP=2's launch 2) and the layer-input projections over the
// residual (K = 7168, the input norm in the prologue), each against the
// launches it replaces (RMSNorm then the tile GEMVs / the group launch
// without a norm), the prologue in its loop form (old) and staged (new).
func TestKernelSmallGroupTiming(t *testing.T) {
	needTiming(t)
	onGPU(t, func(c *cuda.Ctx, k *Set, a *allocs, r *rand.Rand) {
		add := timingTable(t, c, a, r, 1<<30, "small group: device-to-device copy 1 GiB (read+write)", "reference")
		type seg struct {
			N    int
			bf16 bool
		}
		run := func(what string, K int, segs []seg) {
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
					ws[i], ss[i] = devBF16s(c, a, r, nc, sg.N, K), make([]cuda.DevPtr, nc)
				} else {
					ws[i], ss[i] = devFP8s(c, a, r, nc, sg.N, K)
				}
				ys[i] = a.raw(int64(4 * sg.N))
			}
			x, xn, nw := a.up(randF32(r, K, 1)), a.raw(int64(4*K)), a.up(randF32(r, K, 1))
			segsOf := func(i int) []GroupSeg {
				gs := make([]GroupSeg, len(segs))
				for j, sg := range segs {
					gs[j] = GroupSeg{W: ws[j][i%nc], S: ss[j][i%nc], Y: ys[j], N: sg.N, LdY: sg.N, BF16: sg.bf16}
				}
				return gs
			}
			b := float64(bytes)
			for _, on := range []bool{false, true} {
				v := "old"
				if on {
					v = "new"
				}
				withSmall(on, func() {
					add(fmtName("%s rmsnorm + group launch (no norm), graph %s", what, v), b,
						groupGraphUs(c, 2*nc, 11, func(s cuda.Stream, i int) {
							chk(k.RMSNorm(s, xn, x, nw, 1, K, K, K, 1e-6))
							chk(k.GemvGroup(s, xn, K, 1, K, segsOf(i), GroupNorm{}))
						}), "")
					add(fmtName("%s group launch, norm prologue, graph %s", what, v), b,
						groupGraphUs(c, 2*nc, 11, func(s cuda.Stream, i int) {
							chk(k.GemvGroup(s, x, K, 1, K, segsOf(i), GroupNorm{W: nw, Eps: 1e-6}))
						}), "")
				})
			}
			add(fmtName("%s rmsnorm + separate tile GEMVs, graph new", what), b,
				groupGraphUs(c, 2*nc, 11, func(s cuda.Stream, i int) {
					chk(k.RMSNorm(s, xn, x, nw, 1, K, K, K, 1e-6))
					for j, sg := range segs {
						if sg.bf16 {
							chk(k.GemvBF16Wide(s, ys[j], xn, ws[j][i%nc], 0, sg.N, K, 1, K, sg.N))
						} else {
							chk(k.GemvFP8Tile(s, ys[j], xn, ws[j][i%nc], ss[j][i%nc], 0, sg.N, K, 1, K, sg.N))
						}
					}
				}), "")
		}
		run("q_b + idx wq_b", 1536, []seg{{24576, false}, {8192, false}})
		run("attn in (q_a, kv_a, wk, wproj)", 7168, []seg{{1536, false}, {576, false}, {128, false}, {64, true}})
	})
}
