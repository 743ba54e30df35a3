package kernels

import (
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/tilert-go/tilert/cuda"
)

// routeInSource is the default module's text for the routed gate/up:
// common.cuh and the shared headers, gemv_tile.cu (gemv_tile_body), moe.cu
// (moe_route_rank_row) and moe_tile_route.cu, in the module's order.
func routeInSource(t *testing.T) string {
	t.Helper()
	var b strings.Builder
	b.WriteString(moduleSource(kernelFS, "cu/gemv_tile.cu", defaultHeaders...))
	for _, n := range []string{"cu/moe.cu", "cu/moe_tile_route.cu"} {
		src, err := kernelFS.ReadFile(n)
		if err != nil {
			t.Fatal(err)
		}
		b.WriteString("\n#line 1 \"" + strings.TrimPrefix(n, "cu/") + "\"\n")
		b.Write(src)
	}
	return b.String()
}

var ptxasRegsRE = regexp.MustCompile(`Used (\d+) registers`)

// ptxasRegisters is each entry function's register count in a ptxas -v log.
func ptxasRegisters(log string) map[string]string {
	regs := map[string]string{}
	for _, part := range strings.Split(log, "Compiling entry function '")[1:] {
		name, _, _ := strings.Cut(part, "'")
		if m := ptxasRegsRE.FindStringSubmatch(part); m != nil {
			regs[name] = m[1]
		}
	}
	return regs
}

// routeInSpillMax bounds the routed kernels' spill stores (bytes, as ptxas
// -v counts them): the plain _d16 kernels already sit at the 128 registers
// of two blocks an SM (r8 spills 4 bytes with NVRTC 12.9, 8 with 11.8; r2
// 8 / 0); the routed r8 24 / 40, r4 and r2 0-8. More than this means the
// weight loop's registers no longer fit: look before measuring.
const routeInSpillMax = 64

// TestNVRTCCompilesRouteIn: the routed gate/up kernels compile with this
// NVRTC for sm_90a / sm_90 (TILERT_NVRTC picks the library: 11.8 and 12.9)
// within routeInSpillMax bytes of spills at the 128 registers two blocks an
// SM allow; moe_route_rank beside them does not spill.
func TestNVRTCCompilesRouteIn(t *testing.T) {
	nv, err := cuda.LoadNVRTC()
	if err != nil {
		t.Skipf("no NVRTC here, compile check skipped: %v", err)
	}
	src := routeInSource(t)
	// The engine's arch on an H200: sm_90a where this NVRTC builds it (12+),
	// else sm_90.
	cubin := slices.Contains(nv.SupportedArchs(), 90)
	arch := "compute_90"
	switch {
	case nv.CanCompileSM90a():
		arch = "sm_90a"
	case cubin:
		arch = "sm_90"
	}
	_, log, err := nv.CompileLog(src, "moe_tile_route.cu", append(kernelOptions(arch), "-Xptxas", "-v"), cubin)
	if err != nil {
		t.Logf("NVRTC %s refused -Xptxas -v (registers and spills not shown): %v", nv.Version(), err)
		if _, err := nv.Compile(src, "moe_tile_route.cu", kernelOptions(arch), cubin); err != nil {
			t.Fatalf("%+v", err)
		}
		return
	}
	if !cubin {
		t.Logf("NVRTC %s has no sm_90: compiled to PTX only", nv.Version())
		return
	}
	sp, fns := ptxasSpills(log)
	regs := ptxasRegisters(log)
	for _, name := range []string{"gemv_tile_fp8_r2_m1_d16_route", "gemv_tile_fp8_r4_m1_d16_route", "gemv_tile_fp8_r8_m1_d16_route",
		"moe_route_rank", "gemv_tile_fp8_r2_m1_d16", "gemv_tile_fp8_r4_m1_d16", "gemv_tile_fp8_r8_m1_d16"} {
		r, ok := regs[name]
		if !ok {
			t.Errorf("%s: not in ptxas's log", name)
			continue
		}
		n, _ := strconv.Atoi(sp[name])
		switch {
		case strings.HasSuffix(name, "_route") && n > routeInSpillMax:
			t.Errorf("%s spills %d bytes (bound %d)", name, n, routeInSpillMax)
		case name == "moe_route_rank" && n > 0:
			t.Errorf("%s spills %d bytes", name, n)
		}
		t.Logf("%s: %s registers, %d bytes of spill stores", name, r, n)
	}
	t.Logf("NVRTC %s, %s: %d entry functions", nv.Version(), arch, fns)
}

// TestRouteInKernel: which launches take the routed kernel (the experts'
// gate/up of both models at 1..4 rows, beside the shared expert or with it
// as dense slots) and which run moe_route and the plain launch (shapes whose
// variant has no routed form, more experts than a block's threads, slots
// that are not whole rows or past the shared table).
func TestRouteInKernel(t *testing.T) {
	defer func(r int) { TileRule = r }(TileRule)
	TileRule = 3
	ds := RouteIn{E: 256, K: 8, NGroup: 8, TopKGroup: 4}
	glm := RouteIn{E: 256, K: 8, NGroup: 1, TopKGroup: 1}
	tiny := RouteIn{E: 16, K: 4, NGroup: 4, TopKGroup: 2}
	for _, c := range []struct {
		name                        string
		sms, capB                   int
		slots, dense, N, K, shapeAs int
		gateUp                      bool
		rt                          RouteIn
		want                        string
	}{
		{"DeepSeek-V3.2 1 row beside", 132, 0, 8, 0, 2048, 7168, 9, true, ds, "gemv_tile_fp8_r8_m1_d16_route"},
		{"DeepSeek-V3.2 1 row with the shared expert", 132, 0, 8, 1, 2048, 7168, 0, true, ds, "gemv_tile_fp8_r8_m1_d16_route"},
		{"DeepSeek-V3.2 4 rows beside", 132, 0, 32, 0, 2048, 7168, 36, true, ds, "gemv_tile_fp8_r8_m1_d16_route"},
		{"GLM-5 1 row beside", 132, 0, 8, 0, 2048, 6144, 9, true, glm, "gemv_tile_fp8_r8_m1_d16_route"},
		{"GLM-5 4 rows", 132, 0, 32, 4, 2048, 6144, 0, true, glm, "gemv_tile_fp8_r8_m1_d16_route"},
		{"GLM-5 1 row capped", 132, 2, 8, 0, 2048, 6144, 9, true, glm, "gemv_tile_fp8_r8_m1_d16_route"},
		{"TP-8 shard 1 row", 132, 0, 8, 0, 256, 7168, 9, true, ds, "gemv_tile_fp8_r8_m1_d16_route"},
		// The tiny presets on an H200: few blocks, so fewer rows a group.
		{"tiny 1 row", 132, 0, 4, 0, 64, 192, 5, true, tiny, "gemv_tile_fp8_r2_m1_d16_route"},
		{"rows 4 a group", 132, 0, 8, 0, 128, 1536, 0, true, ds, "gemv_tile_fp8_r4_m1_d16_route"},
		{"8 rows (64 slots)", 132, 0, 64, 0, 2048, 7168, 72, true, ds, "gemv_tile_fp8_r8_m1_d16_route"},
		// Fallbacks: moe_route + the plain launch.
		{"tiny 4 rows (variant _o4)", 132, 0, 16, 0, 64, 256, 20, true, tiny, ""},
		{"variant _o4 (short rows)", 132, 0, 8, 0, 7168, 2048, 9, false, ds, ""},
		{"more experts than threads", 132, 0, 8, 0, 2048, 7168, 9, true, RouteIn{E: 288, K: 8, NGroup: 8, TopKGroup: 4}, ""},
		{"slots past the table", 132, 0, 72, 0, 2048, 7168, 81, true, ds, ""},
		{"not whole rows", 132, 0, 12, 0, 2048, 7168, 13, true, ds, ""},
		{"no routed slots", 132, 0, 0, 1, 2048, 7168, 0, true, ds, ""},
	} {
		if got := routeInKernel(c.sms, c.capB, c.slots, c.dense, c.N, c.K, c.shapeAs, c.gateUp, c.rt); got != c.want {
			t.Errorf("%s: %q, want %q", c.name, got, c.want)
		}
	}
	// The routed form exists exactly for the variants routeInName names,
	// each in the default module and on the programmatic list.
	entries := kernelEntries(KernelSource())
	for _, r := range []int{1, 2, 4, 8} {
		for _, v := range tileVariants {
			tile := fmtName("gemv_tile_fp8_r%d_m1%s", r, v)
			name, ok := routeInName(tile)
			if want := v == "_d16" && r >= 2; ok != want {
				t.Errorf("%s: routed form %v, want %v", tile, ok, want)
			}
			if !ok {
				continue
			}
			if _, ok := entries[name]; !ok {
				t.Errorf("%s: the module defines no %s", tile, name)
			}
			if !pdlKernels[name] {
				t.Errorf("%s is not on pdlKernels: it would launch plainly behind the router", name)
			}
		}
	}
}

// TestCheckRouteIn: ExpertsFP8Routed refuses what neither path can run.
func TestCheckRouteIn(t *testing.T) {
	ok := RouteIn{Idx: 1, Wts: 2, Logits: 3, E: 256, K: 8, NGroup: 8, TopKGroup: 4}
	if err := checkRouteIn(16, ok); err != nil {
		t.Fatalf("%+v", err)
	}
	for _, c := range []struct {
		name  string
		slots int
		f     func(*RouteIn)
	}{
		{"not whole rows", 12, nil},
		{"no slots", 0, nil},
		{"K 0", 8, func(r *RouteIn) { r.K = 0 }},
		{"groups do not divide E", 8, func(r *RouteIn) { r.NGroup = 7 }},
		{"E past moe_route", 8, func(r *RouteIn) { r.E = 2048 }},
		{"no logits", 8, func(r *RouteIn) { r.Logits = 0 }},
		{"no ids", 8, func(r *RouteIn) { r.Idx = 0 }},
	} {
		rt := ok
		if c.f != nil {
			c.f(&rt)
		}
		if err := checkRouteIn(c.slots, rt); err == nil {
			t.Errorf("%s: accepted", c.name)
		}
	}
}
