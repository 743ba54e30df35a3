package kernels

import (
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/cockroachdb/errors"

	"github.com/tilert-go/tilert/cuda"
)

// Checks of cu/router.cu (RouterRoute): against GemvBF16Wide (4 rows a
// launch, as the engine splits them) then MoERoute, bit for bit, on fresh
// random inputs; the counter back at 0 after every launch, direct and in
// graph replays.

// routerCase is a router shape: E experts of H weights, K picked.
type routerCase struct {
	name              string
	E, H, K           int
	ngroup, topkGroup int
	norm, bias        bool
}

var routerCases = []routerCase{
	{"deepseek-v3.2", 256, 7168, 8, 8, 4, true, true},
	{"glm-5", 256, 6144, 8, 1, 1, true, true},
	{"small", 64, 512, 6, 1, 1, true, false},
	{"groups-of-20", 160, 1024, 8, 8, 3, false, true},
	{"odd", 37, 264, 3, 1, 1, true, true},
}

// routerTwoLaunches is what the engine ran before RouterRoute: the wide
// GEMV 4 rows a launch, then the routing.
func routerTwoLaunches(k *Set, s cuda.Stream, lg, idx, wts, x, w, bias cuda.DevPtr, cs routerCase, M, ldx, ldy int) {
	for r0 := 0; r0 < M; r0 += 4 {
		chk(k.GemvBF16Wide(s, lg.Add(int64(4*r0*ldy)), x.Add(int64(4*r0*ldx)), w, 0, cs.E, cs.H, min(4, M-r0), ldx, ldy))
	}
	chk(k.MoERoute(s, idx, wts, lg, bias, M, cs.E, cs.K, cs.ngroup, cs.topkGroup, cs.norm, 2.5))
}

func TestKernelRouterRoute(t *testing.T) {
	onGPU(t, func(c *cuda.Ctx, k *Set, a *allocs, r *rand.Rand) {
		s := c.Stream()
		ws := a.up([]uint32{0})
		pdls := []bool{false}
		if k.PDLSupported() {
			pdls = append(pdls, true)
		}
		defer k.SetPDL(k.PDL())
		defer func(f int) { forceGemvWideRows = f }(forceGemvWideRows)
		for i, cs := range routerCases {
			// E <= 256 takes one row a block on any large GPU: the groups-of-20
			// case runs the 2-row variant, the odd one the 4-row (both the
			// wide GEMV and RouterRoute follow gemvWideRows).
			forceGemvWideRows = map[int]int{3: 2, 4: 4}[i]
			wb := randBF16(r, cs.E*cs.H, 0.05)
			w := a.up(wb)
			bias := cuda.DevPtr(0)
			if cs.bias {
				bias = a.up(randF32(r, cs.E, 0.1))
			}
			for _, M := range []int{1, 2, 3, 4, 5, 8} {
				ldx, ldy := cs.H+8*(M%2), cs.E
				x := a.up(randF32(r, M*ldx, 1))
				lg1, idx1, wt1 := a.poisoned(M*ldy), a.poisoned(M*cs.K), a.poisoned(M*cs.K)
				routerTwoLaunches(k, s, lg1, idx1, wt1, x, w, bias, cs, M, ldx, ldy)
				want := [3][]uint32{f32Bits(downF32(c, lg1, M*ldy)), i32Bits(downI32(c, idx1, M*cs.K)), f32Bits(downF32(c, wt1, M*cs.K))}
				for _, pdl := range pdls {
					k.SetPDL(pdl)
					tag := fmt.Sprintf("%s E=%d H=%d K=%d M=%d R=%d pdl=%v", cs.name, cs.E, cs.H, cs.K, M, k.gemvWideRows(cs.E, cs.H, 2, 1), pdl)
					lg2, idx2, wt2 := a.poisoned(M*ldy), a.poisoned(M*cs.K), a.poisoned(M*cs.K)
					run := func() {
						chk(k.RouterRoute(s, lg2, idx2, wt2, x, w, bias, ws, M, cs.E, cs.H, cs.K, ldx, ldy, cs.ngroup, cs.topkGroup, cs.norm, 2.5))
					}
					got := func() int {
						bad := diffBits(want[0], f32Bits(downF32(c, lg2, M*ldy))) + diffBits(want[1], i32Bits(downI32(c, idx2, M*cs.K))) +
							diffBits(want[2], f32Bits(downF32(c, wt2, M*cs.K)))
						if downI32(c, ws, 1)[0] != 0 {
							bad += 1000 // the counter must be back at 0
						}
						return bad
					}
					run()
					record(t, "router_route vs gemv_bf16_wide+moe_route "+tag, "mismatched values", float64(got()), 0)
					run() // the second launch needs the counter the first put back
					record(t, "router_route again "+tag, "mismatched values", float64(got()), 0)
					// Three launches in one graph, replayed three times.
					chk(c.SyncStream(s))
					chk(c.BeginCapture(s))
					for range 3 {
						run()
					}
					g, err := c.EndCapture(s)
					chk(err)
					for range 3 {
						chk(c.LaunchGraph(g, s))
					}
					chk(c.SyncStream(s))
					chk(c.DestroyGraph(g))
					record(t, "router_route graph replays "+tag, "mismatched values", float64(got()), 0)
				}
			}
		}
	})
}

func f32Bits(v []float32) []uint32 {
	out := make([]uint32, len(v))
	for i, f := range v {
		out[i] = math.Float32bits(f)
	}
	return out
}

func i32Bits(v []int32) []uint32 {
	out := make([]uint32, len(v))
	for i, x := range v {
		out[i] = uint32(x)
	}
	return out
}

func diffBits(a, b []uint32) int {
	n := 0
	for i := range a {
		if a[i] != b[i] {
			n++
		}
	}
	return n
}

// TestKernelTimingRouterRoute: the two launches against RouterRoute at 1,
// 2 and 4 rows (for TILERT_GPU_ROUTE_FUSED's limit), DeepSeek-V3.2 and
// GLM-5 dims, graph-timed (as the engine's decode graphs run them), plain
// and programmatic launches.
func TestKernelTimingRouterRoute(t *testing.T) {
	needTiming(t)
	onGPU(t, func(c *cuda.Ctx, k *Set, a *allocs, r *rand.Rand) {
		s := c.Stream()
		add := timingTable(t, c, a, r, 256<<20, "router: device-to-device copy 256 MiB (read+write)", "reference of this table")
		pdls := []bool{false}
		if k.PDLSupported() {
			pdls = append(pdls, true)
		}
		defer k.SetPDL(k.PDL())
		ws := a.up([]uint32{0})
		for _, cs := range routerCases[:2] {
			w := a.up(randBF16(r, cs.E*cs.H, 0.05))
			bias := a.up(randF32(r, cs.E, 0.1))
			for _, M := range []int{1, 2, 4} {
				x := a.up(randF32(r, M*cs.H, 1))
				lg, idx, wts := a.raw(int64(4*M*cs.E)), a.raw(int64(4*M*cs.K)), a.raw(int64(4*M*cs.K))
				bytes := float64(2*cs.E*cs.H + 4*M*cs.H + 4*M*cs.E)
				for _, pdl := range pdls {
					k.SetPDL(pdl)
					two := graphUs(c, s, 20, func() { routerTwoLaunches(k, s, lg, idx, wts, x, w, bias, cs, M, cs.H, cs.E) })
					add(fmtName("%s gemv_bf16_wide + moe_route (2 launches) M=%d pdl=%v graph", cs.name, M, pdl), bytes, two, "")
					one := graphUs(c, s, 20, func() {
						chk(k.RouterRoute(s, lg, idx, wts, x, w, bias, ws, M, cs.E, cs.H, cs.K, cs.H, cs.E, cs.ngroup, cs.topkGroup, cs.norm, 2.5))
					})
					add(fmtName("%s moe_router_route (1 launch) M=%d pdl=%v graph", cs.name, M, pdl), bytes, one, fmtName("%.2fx the 2 launches", two/one))
				}
			}
		}
	})
}

// The launcher's checks, no GPU needed: shapes it cannot take are refused
// with a hint, and every rows-per-block variant it may name is defined.
func TestRouterRouteChecks(t *testing.T) {
	for _, bad := range []struct{ M, E, H, K, ldx, ldy int }{
		{0, 256, 7168, 8, 7168, 256},
		{9, 256, 7168, 8, 7168, 256},
		{1, 257, 7168, 8, 7168, 256},
		{1, 256, 0, 8, 7168, 256},
		{1, 256, 7168, 0, 7168, 256},
		{1, 4, 64, 5, 64, 4},
		{1, 256, 7168, 65, 7168, 256},
		{1, 256, 7168, 8, 7000, 256},
		{1, 256, 7168, 8, 7168, 255},
	} {
		err := checkRouterRoute(bad.M, bad.E, bad.H, bad.K, bad.ldx, bad.ldy)
		if err == nil {
			t.Errorf("%+v accepted", bad)
			continue
		}
		if hints := errors.GetAllHints(err); len(hints) == 0 {
			t.Errorf("%+v: %v without a hint", bad, err)
		}
		if RouterRouteOK(0, 0, bad.M, bad.E, bad.H, bad.K, bad.ldx, bad.ldy) {
			t.Errorf("RouterRouteOK takes %+v", bad)
		}
	}
	if err := checkRouterRoute(8, 256, 7168, 8, 7168, 256); err != nil {
		t.Errorf("DeepSeek-V3.2 at 8 rows refused: %v", err)
	}
	if !RouterRouteOK(0x1000, 0x2000, 4, 256, 6144, 8, 6144, 256) {
		t.Errorf("GLM-5 at 4 rows refused")
	}
	// Misaligned x or w, or H not whole 16-byte chunks: the wide GEMV's limits.
	for _, c := range []struct {
		x, w  cuda.DevPtr
		H, ld int
	}{{0x1004, 0x2000, 7168, 7168}, {0x1000, 0x2008, 7168, 7168}, {0x1000, 0x2000, 7164, 7164}, {0x1000, 0x2000, 7168, 7170}} {
		if RouterRouteOK(c.x, c.w, 1, 256, c.H, 8, c.ld, 256) {
			t.Errorf("RouterRouteOK takes x %#x w %#x H %d ldx %d", uint64(c.x), uint64(c.w), c.H, c.ld)
		}
	}
	src := KernelSource()
	for _, r := range []int{1, 2, 4, 8} {
		for _, mm := range []int{4, 8} {
			name := fmt.Sprintf("moe_router_route_r%d_m%d", r, mm)
			if !strings.Contains(src, name+"(") {
				t.Errorf("%s not defined in the kernels", name)
			}
			if !pdlWeightsFirst[name] {
				t.Errorf("%s not on pdlWeightsFirst", name)
			}
		}
	}
}
