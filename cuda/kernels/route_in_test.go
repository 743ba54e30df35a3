package kernels

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/tilert-go/tilert/cuda"
)

// routeInCase is one routing rule for the routed gate/up checks.
type routeInCase struct {
	name              string
	E, K, ngroup, tkg int
	norm, bias        bool
	levels            int // 0: normal logits; else that many levels (ties)
}

var routeInCases = []routeInCase{
	{"DeepSeek-V3.2 256 groups 8/4", 256, 8, 8, 4, true, true, 0},
	{"DeepSeek-V3.2 ties", 256, 8, 8, 4, true, true, 3},
	{"GLM-5 256 plain", 256, 8, 1, 1, true, true, 0},
	{"GLM-5 ties no bias", 256, 8, 1, 1, true, false, 4},
	{"tiny DeepSeek 16 groups 4/2", 16, 4, 4, 2, true, true, 0},
	{"tiny GLM-5 16 ties", 16, 4, 1, 1, true, true, 2},
	{"64 experts K 6 groups of 16, no norm", 64, 6, 4, 2, false, true, 0},
}

// routeInLogits is rows of E router logits (with ties at levels > 0) and
// a bias (0 without).
func routeInLogits(r *rand.Rand, a *allocs, cs routeInCase, M int) (lg []float32, bias cuda.DevPtr) {
	if cs.levels > 0 {
		lg = quantised(r, M*cs.E, cs.levels)
	} else {
		lg = randF32(r, M*cs.E, 2)
	}
	if cs.bias {
		if cs.levels > 0 {
			bias = a.up(quantised(r, cs.E, 2))
		} else {
			bias = a.up(randF32(r, cs.E, 0.1))
		}
	}
	return lg, bias
}

// TestKernelRouteIn: ExpertsFP8Routed against MoERoute then
// ExpertsFP8Shaped, bit for bit (ids, weights, every slot's gate/up
// output), on fresh random logits (ties included) and inputs, 1..4 rows,
// the routed slots alone (shaped as with the shared expert, as beside it)
// and with the shared expert as dense slots, every routed variant forced
// (r2 / r4 / r8 _d16) and a variant without a routed form (_o4: the
// fallback), capped grids (blocks taking several tiles); then in CUDA graphs
// behind the router GEMV, launched programmatically where the device can.
func TestKernelRouteIn(t *testing.T) {
	defer func() { forceTileG, forceTileR, forceTileV, forceTileB = 0, 0, "", 0 }()
	onGPU(t, func(c *cuda.Ctx, k *Set, a *allocs, r *rand.Rand) {
		s := c.Stream()
		// Small GEMV dims so that all 256 experts are distinct weights.
		const N, H, maxE = 128, 1536, 256
		g := randFP8Experts(r, a, maxE+1, N, H)
		u := randFP8Experts(r, a, maxE+1, N, H)
		gT, gS := a.up(g.wp[:maxE]), a.up(g.sp[:maxE])
		uT, uS := a.up(u.wp[:maxE]), a.up(u.sp[:maxE])
		shW := [2]cuda.DevPtr{g.wp[maxE], u.wp[maxE]}
		shS := [2]cuda.DevPtr{g.sp[maxE], u.sp[maxE]}
		T := [2]cuda.DevPtr{gT, uT}
		TS := [2]cuda.DevPtr{gS, uS}
		type shape struct {
			R    int
			V    string
			B    int
			want bool // the routed kernel runs
		}
		shapes := []shape{{0, "", 0, true}, {2, "_d16", 0, true}, {4, "_d16", 0, true}, {8, "_d16", 0, true},
			{8, "_d16", 2, true}, {4, "_o4", 0, false}}
		ran := map[string]int{}
		for _, cs := range routeInCases {
			for M := 1; M <= 4; M++ {
				slots := M * cs.K
				lgv, bias := routeInLogits(r, a, cs, M)
				lg := a.up(lgv)
				x := a.up(randF32(r, M*H, 1))
				for _, sh := range shapes {
					for _, dense := range []int{0, M} {
						forceTileR, forceTileV, forceTileB = sh.R, sh.V, sh.B
						shapeAs := slots + M // the launch over all slots, as beside the shared expert
						if dense > 0 {
							shapeAs = 0
						}
						var w, ws [2]cuda.DevPtr
						if dense > 0 {
							w, ws = shW, shS
						}
						i0, w0, y0 := a.poisoned(slots), a.poisoned(slots), a.poisoned((slots+dense)*N)
						chk(k.MoERoute(s, i0, w0, lg, bias, M, cs.E, cs.K, cs.ngroup, cs.tkg, cs.norm, 2.5))
						chk(k.ExpertsFP8Shaped(s, y0, x, H, cs.K, 0, T, TS, i0, slots, w, ws, dense, N, H, shapeAs))
						i1, w1, y1 := a.poisoned(slots), a.poisoned(slots), a.poisoned((slots+dense)*N)
						rt := RouteIn{Idx: i1, Wts: w1, Logits: lg, Bias: bias, E: cs.E, K: cs.K, NGroup: cs.ngroup, TopKGroup: cs.tkg,
							Norm: cs.norm, Scale: 2.5}
						name := k.ExpertsRoutedKernel(slots, dense, N, H, shapeAs, true, rt)
						chk(k.ExpertsFP8Routed(s, y1, x, H, 0, T, TS, slots, w, ws, dense, N, H, shapeAs, rt))
						bad := diffF32Bits(downF32(c, y0, (slots+dense)*N), downF32(c, y1, (slots+dense)*N)) +
							diffF32Bits(downF32(c, w0, slots), downF32(c, w1, slots))
						ia, ib := downI32(c, i0, slots), downI32(c, i1, slots)
						for i := range ia {
							if ia[i] != ib[i] {
								bad++
							}
						}
						tag := fmt.Sprintf("%s M=%d R=%d%s B=%d dense=%d (%s)", cs.name, M, sh.R, sh.V, sh.B, dense, name)
						record(t, "routed gate/up vs moe_route + gate/up "+tag, "mismatched values", float64(bad), 0)
						if (name != "") != sh.want && cs.E <= tileThreads {
							t.Errorf("%s: kernel %q, want the routed one %v", tag, name, sh.want)
						}
						ran[name]++
					}
				}
			}
		}
		forceTileR, forceTileV, forceTileB = 0, "", 0
		t.Logf("launches by kernel (\"\": moe_route + the plain kernel): %v", ran)
		for _, n := range []string{"gemv_tile_fp8_r2_m1_d16_route", "gemv_tile_fp8_r4_m1_d16_route", "gemv_tile_fp8_r8_m1_d16_route", ""} {
			if ran[n] == 0 {
				t.Errorf("%q never ran", n)
			}
		}
		routeInGraphs(t, c, k, a, r, T, TS, N, H)
	})
}

// routeInGraphs checks the chain router GEMV -> routed gate/up against
// router GEMV -> moe_route -> gate/up inside CUDA graphs (programmatic
// launches where the device has them: the routed kernel's wait is what
// orders its logits reads after the router), replayed on fresh inputs, bit
// for bit.
func routeInGraphs(t *testing.T, c *cuda.Ctx, k *Set, a *allocs, r *rand.Rand, T, TS [2]cuda.DevPtr, N, H int) {
	prev := k.PDL()
	k.SetPDL(true)
	defer k.SetPDL(prev)
	s := c.Stream()
	for _, cs := range []routeInCase{routeInCases[0], routeInCases[2], routeInCases[1]} {
		for _, M := range []int{1, 4} {
			slots := M * cs.K
			wr := a.up(randBF16(r, cs.E*H, 0.05))
			_, bias := routeInLogits(r, a, cs, M)
			x := a.raw(int64(4 * M * H))
			lg0, lg1 := a.raw(int64(4*M*cs.E)), a.raw(int64(4*M*cs.E))
			i0, w0, y0 := a.raw(int64(4*slots)), a.raw(int64(4*slots)), a.raw(int64(4*slots*N))
			i1, w1, y1 := a.raw(int64(4*slots)), a.raw(int64(4*slots)), a.raw(int64(4*slots*N))
			rt := RouteIn{Idx: i1, Wts: w1, Logits: lg1, Bias: bias, E: cs.E, K: cs.K, NGroup: cs.ngroup, TopKGroup: cs.tkg, Norm: cs.norm, Scale: 2.5}
			capture := func(f func()) *cuda.Graph {
				chk(c.BeginCapture(s))
				f()
				gr, err := c.EndCapture(s)
				chk(err)
				return gr
			}
			two := capture(func() {
				chk(k.GemvBF16Wide(s, lg0, x, wr, 0, cs.E, H, M, H, cs.E))
				chk(k.MoERoute(s, i0, w0, lg0, bias, M, cs.E, cs.K, cs.ngroup, cs.tkg, cs.norm, 2.5))
				chk(k.ExpertsFP8Shaped(s, y0, x, H, cs.K, 0, T, TS, i0, slots, [2]cuda.DevPtr{}, [2]cuda.DevPtr{}, 0, N, H, slots+M))
			})
			one := capture(func() {
				chk(k.GemvBF16Wide(s, lg1, x, wr, 0, cs.E, H, M, H, cs.E))
				chk(k.ExpertsFP8Routed(s, y1, x, H, 0, T, TS, slots, [2]cuda.DevPtr{}, [2]cuda.DevPtr{}, 0, N, H, slots+M, rt))
			})
			for rep := range 3 {
				chk(c.Upload(x, randF32(r, M*H, 1)))
				for _, p := range []cuda.DevPtr{i0, w0, i1, w1} {
					chk(c.MemsetD32(p, 0x7fc00000, int64(slots), s))
				}
				for _, p := range []cuda.DevPtr{y0, y1} {
					chk(c.MemsetD32(p, 0x7fc00000, int64(slots*N), s))
				}
				chk(c.LaunchGraph(two, s))
				chk(c.LaunchGraph(one, s))
				chk(c.SyncStream(s))
				bad := diffF32Bits(downF32(c, y0, slots*N), downF32(c, y1, slots*N)) + diffF32Bits(downF32(c, w0, slots), downF32(c, w1, slots))
				ia, ib := downI32(c, i0, slots), downI32(c, i1, slots)
				for i := range ia {
					if ia[i] != ib[i] {
						bad++
					}
				}
				record(t, fmt.Sprintf("graph: router -> routed gate/up vs router -> moe_route -> gate/up %s M=%d replay %d (programmatic %v)",
					cs.name, M, rep, k.PDL()), "mismatched values", float64(bad), 0)
			}
			chk(c.DestroyGraph(two))
			chk(c.DestroyGraph(one))
		}
	}
}

// TestKernelRouteInTiming graph-times the MoE front's chain at both models'
// shapes, 1 and 4 rows, weights cold (all 256 experts' gate/up, inputs
// rotated so that the routing picks other experts each launch): the router
// GEMV, moe_route_rank and the routed slots' gate/up (beside the shared
// expert, as the engine runs them) against the router GEMV and the routed
// gate/up; each also with the grid capped at 2 blocks an SM (every block
// routes once), launched programmatically and plainly. The router and
// routing alone are rows too, so the chain's share after the router shows.
func TestKernelRouteInTiming(t *testing.T) {
	needTiming(t)
	onGPU(t, func(c *cuda.Ctx, k *Set, a *allocs, r *rand.Rand) {
		s := c.Stream()
		add := timingTable(t, c, a, r, 256<<20, "route in: device-to-device copy 256 MiB (read+write)", "reference of this table")
		prevPDL, prevCap := k.PDL(), k.TileCap()
		defer func() { k.SetPDL(prevPDL); k.SetTileCap(prevCap) }()
		for _, m := range []struct {
			name               string
			H, I, E, K, ng, tg int
		}{
			{"DeepSeek-V3.2", 7168, 2048, 256, 8, 8, 4},
			{"GLM-5", 6144, 2048, 256, 8, 1, 1},
		} {
			ma := &allocs{c: c}
			gw, gs := devFP8s(c, ma, r, m.E, m.I, m.H)
			uw, us := devFP8s(c, ma, r, m.E, m.I, m.H)
			T := [2]cuda.DevPtr{ma.up(gw), ma.up(uw)}
			TS := [2]cuda.DevPtr{ma.up(gs), ma.up(us)}
			wr := ma.up(randBF16(r, m.E*m.H, 0.05))
			bias := ma.up(randF32(r, m.E, 0.1))
			const sets = 16
			for _, M := range []int{1, 4} {
				slots := M * m.K
				xs := make([]cuda.DevPtr, sets)
				for i := range xs {
					xs[i] = ma.up(randF32(r, M*m.H, 1))
				}
				lg, ids, wts := ma.raw(int64(4*M*m.E)), ma.raw(int64(4*slots)), ma.raw(int64(4*slots))
				y := ma.raw(int64(4 * slots * m.I))
				rt := RouteIn{Idx: ids, Wts: wts, Logits: lg, Bias: bias, E: m.E, K: m.K, NGroup: m.ng, TopKGroup: m.tg, Norm: true, Scale: 2.5}
				router := func(i int) { chk(k.GemvBF16Wide(s, lg, xs[i%sets], wr, 0, m.E, m.H, M, m.H, m.E)) }
				route := func() { chk(k.MoERoute(s, ids, wts, lg, bias, M, m.E, m.K, m.ng, m.tg, true, 2.5)) }
				gateUp := func(i int) {
					chk(k.ExpertsFP8Shaped(s, y, xs[i%sets], m.H, m.K, 0, T, TS, ids, slots, [2]cuda.DevPtr{}, [2]cuda.DevPtr{}, 0, m.I, m.H, slots+M))
				}
				routed := func(i int) {
					chk(k.ExpertsFP8Routed(s, y, xs[i%sets], m.H, 0, T, TS, slots, [2]cuda.DevPtr{}, [2]cuda.DevPtr{}, 0, m.I, m.H, slots+M, rt))
				}
				bytes := float64(slots*2*m.I*m.H) + float64(2*m.E*m.H)
				for _, pdl := range []bool{true, false} {
					if pdl && !k.PDLSupported() {
						continue
					}
					k.SetPDL(pdl)
					tag := fmt.Sprintf("%s M=%d pdl=%v", m.name, M, k.PDL())
					add("router "+tag, float64(2*m.E*m.H), graphUsRot(c, s, 20, 21, router), "")
					add("router + moe_route_rank "+tag, float64(2*m.E*m.H), graphUsRot(c, s, 20, 21, func(i int) { router(i); route() }), "")
					for _, capB := range []int{0, 2} {
						k.SetTileCap(capB)
						ctag := fmt.Sprintf("%s cap=%d", tag, capB)
						three := graphUsRot(c, s, 20, 21, func(i int) { router(i); route(); gateUp(i) })
						add("router -> moe_route_rank -> gate/up "+ctag, bytes, three, "")
						two := graphUsRot(c, s, 20, 21, func(i int) { router(i); routed(i) })
						add("router -> gate/up with the routing "+ctag, bytes, two,
							fmt.Sprintf("%s, %+.2f us against the three launches", k.ExpertsRoutedKernel(slots, 0, m.I, m.H, slots+M, true, rt), two-three))
					}
					k.SetTileCap(prevCap)
				}
			}
			ma.free()
		}
	})
}
