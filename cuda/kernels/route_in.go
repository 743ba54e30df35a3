package kernels

import (
	"fmt"

	"github.com/cockroachdb/errors"

	"github.com/tilert-go/tilert/cuda"
)

// The routed experts' gate/up with the routing inside (cu/moe_tile_route.cu,
// issue 10): at one to four decode rows moe_route_rank is one block a row
// between the router GEMV and the experts' gate/up, and its launch boundary
// costs more than its work. ExpertsFP8Routed runs that routing in every
// block of the gate/up launch instead (moe_route_rank_row's code, so the same
// ids and weights bit for bit), or moe_route_rank and the plain launch where
// the shape has no routed form.

// RouteIn is the routing ExpertsFP8Routed runs with its launch: MoERoute's
// arguments for the launch's rows (Logits [rows][E] float32, Bias [E] or 0;
// Idx and Wts [rows][K] are written).
type RouteIn struct {
	Idx, Wts, Logits, Bias  cuda.DevPtr
	E, K, NGroup, TopKGroup int
	Norm                    bool
	Scale                   float32
}

// routeInSlots is cu/moe_tile_route.cu's ROUTE_IN_SLOTS: the routed slots
// one launch holds (its shared id table).
const routeInSlots = 64

// routeInName is the routed form of the tile kernel named tile, if it has
// one: the one-row fp8 variants with 16 loads in flight, which the experts'
// gate/up of both models takes (tileVariant3).
func routeInName(tile string) (string, bool) {
	switch tile {
	case "gemv_tile_fp8_r2_m1_d16", "gemv_tile_fp8_r4_m1_d16", "gemv_tile_fp8_r8_m1_d16":
		return tile + "_route", true
	}
	return "", false
}

// routeInFits says whether a launch of slots routed slots can route inside
// its blocks: whole rows of rt.K slots, at most routeInSlots, and E experts
// within a block's threads (moe_route_rank_row's blockDim >= E).
func routeInFits(slots int, rt RouteIn) bool {
	return slots > 0 && slots <= routeInSlots && rt.K > 0 && slots%rt.K == 0 && rt.E > 0 && rt.E <= tileThreads
}

// checkRouteIn refuses what ExpertsFP8Routed cannot run either way.
func checkRouteIn(slots int, rt RouteIn) error {
	if slots <= 0 || rt.K <= 0 || slots%rt.K != 0 {
		return errors.WithHint(errors.Newf("experts routed: %d routed slots are not whole rows of K=%d", slots, rt.K),
			"pass slots = rows x K: the routing fills every slot of its rows")
	}
	if err := checkRoute(slots/rt.K, rt.E, rt.K, rt.NGroup, rt.TopKGroup); err != nil {
		return err
	}
	if rt.Idx == 0 || rt.Wts == 0 || rt.Logits == 0 {
		return errors.WithHint(errors.Newf("experts routed: null routing pointer (idx %#x, wts %#x, logits %#x)",
			uint64(rt.Idx), uint64(rt.Wts), uint64(rt.Logits)), "the routing needs its logits and the buffers for the ids and weights")
	}
	return nil
}

// ExpertsRoutedKernel is the kernel ExpertsFP8Routed launches for these
// arguments, "" where it runs moe_route and the plain tile launch instead.
func (k *Set) ExpertsRoutedKernel(slots, dense, N, K, shapeSlots int, gateUp bool, rt RouteIn) string {
	return routeInKernel(k.c.Info().SMs, k.tileCap(), slots, dense, N, K, shapeSlots, gateUp, rt)
}

// routeInKernel is ExpertsRoutedKernel on a device of sms SMs under a cap
// of capB blocks an SM: the routed form of the variant the plain launch
// takes (no pinned plan applies to routed slots: tilePlan).
func routeInKernel(sms, capB, slots, dense, N, K, shapeSlots int, gateUp bool, rt RouteIn) string {
	if !routeInFits(slots, rt) {
		return ""
	}
	a := tileLaunch{slots: slots, dense: dense, N: N, K: K, M: 1, shapeSlots: shapeSlots}
	if gateUp {
		a.t1 = 1 // only its being set matters to the shape
	}
	wt, _, R, v, _ := tileConfOn(sms, capB, a)
	name, _ := routeInName(fmt.Sprintf("gemv_tile_%s_r%d_m1%s", wt, R, v))
	return name
}

// ExpertsFP8Routed is MoERoute(rt.Idx, rt.Wts, rt.Logits, rt.Bias,
// slots/rt.K rows, ...) then ExpertsFP8Shaped(y, x, ldx, rt.K, xsh, t, ts,
// rt.Idx, slots, w, ws, dense, N, K, shapeSlots) - slot j is row j/rt.K's
// choice j%rt.K - in one launch where ExpertsRoutedKernel names one, with
// the same ids, weights and outputs bit for bit. Whatever reads rt.Idx or
// rt.Wts must run after this launch has completed (the next launch on the
// stream does).
func (k *Set) ExpertsFP8Routed(s cuda.Stream, y, x cuda.DevPtr, ldx, xsh int, t, ts [2]cuda.DevPtr, slots int,
	w, ws [2]cuda.DevPtr, dense, N, K, shapeSlots int, rt RouteIn) error {
	if err := checkRouteIn(slots, rt); err != nil {
		return err
	}
	a, err := expertsArgs(y, x, ldx, rt.K, xsh, t, ts, rt.Idx, slots, w, ws, dense, N, K, shapeSlots)
	if err != nil {
		return err
	}
	name := k.ExpertsRoutedKernel(slots, dense, N, K, shapeSlots, t[1] != 0 || w[1] != 0, rt)
	if name == "" {
		if err := k.MoERoute(s, rt.Idx, rt.Wts, rt.Logits, rt.Bias, slots/rt.K, rt.E, rt.K, rt.NGroup, rt.TopKGroup, rt.Norm, rt.Scale); err != nil {
			return err
		}
		return k.tile(s, a)
	}
	_, grid, G := k.tileConf(a)
	return k.launch(name, grid, cuda.D1(tileThreads), 0, s, a.t0, a.ts0, a.t1, a.ts1, a.slots, a.w0, a.s0, a.w1, a.s1,
		a.x, a.ldx, a.xsh, a.y, a.ldy, a.N, a.K, G, b2i(TileRule >= 2),
		rt.Logits, rt.Bias, rt.Idx, rt.Wts, rt.E, rt.K, rt.NGroup, rt.TopKGroup, b2i(rt.Norm), rt.Scale)
}
