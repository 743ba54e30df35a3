package gpu

import (
	"testing"

	"github.com/tilert-go/tilert/engine"
	"github.com/tilert-go/tilert/engine/internal/enginetest"
)

// The routing inside the experts' gate/up launch (TILERT_GPU_ROUTE_IN_GEMV=1,
// expertsRouted) must give what the router GEMV, moeRoute and the gate/up
// launch give: the same tokens and cache bytes, one slot and two slots with
// MTP (1..4 rows a step). Each expertsRouted launch takes the place of one
// moeRoute and one gate/up experts launch; steps of more rows (the prompt)
// keep moeRoute.
func TestEmuRouteInEqual(t *testing.T) { testRouteInEqual(t, onEmu) }
func TestGPURouteInEqual(t *testing.T) { testRouteInEqual(t, onGPU) }

func testRouteInEqual(t *testing.T, kind deviceKind) {
	if kind == onGPU {
		gpuDevice(t)
	}
	defer func(on bool) { routeInOn = on }(routeInOn)
	for _, pr := range enginetest.Presets {
		t.Run(pr, func(t *testing.T) {
			c := newSwitchCasePast(t, pr)
			var r [2]switchRun
			for k, on := range []bool{false, true} {
				routeInOn = on
				r[k] = c.run(t, kind, true)
			}
			r[1].sameAs(t, r[0], "routing inside the gate/up", "three launches")
			n := r[1].ops["expertsRouted"]
			if r[0].ops["expertsRouted"] != 0 || n == 0 {
				t.Errorf("expertsRouted launches: %d off, %d on (want 0 and some)", r[0].ops["expertsRouted"], n)
			}
			if r[1].ops["moeRoute"]+n != r[0].ops["moeRoute"] {
				t.Errorf("moeRoute: %d launches off, %d on beside %d routed (want each routed launch to replace one)",
					r[0].ops["moeRoute"], r[1].ops["moeRoute"], n)
			}
			if r[1].ops["expertsGateUp"]+n != r[0].ops["expertsGateUp"] {
				t.Errorf("expertsGateUp: %d launches off, %d on beside %d routed (want each routed launch to replace one)",
					r[0].ops["expertsGateUp"], r[1].ops["expertsGateUp"], n)
			}
			t.Logf("%s launches off/on: moeRoute %d/%d expertsGateUp %d/%d; expertsRouted %d", kind,
				r[0].ops["moeRoute"], r[1].ops["moeRoute"], r[0].ops["expertsGateUp"], r[1].ops["expertsGateUp"], n)
		})
	}
}

// Greedy decoding equals the CPU engine's with the routing inside the
// gate/up launch and without it (the GPU check of the kernel's bits inside
// the engine).
func TestGPUGreedyMatchesCPURouteIn(t *testing.T) {
	defer func(on bool) { routeInOn = on }(routeInOn)
	for _, on := range []bool{false, true} {
		routeInOn = on
		tag := " (TILERT_GPU_ROUTE_IN_GEMV=0)"
		if on {
			tag = " (TILERT_GPU_ROUTE_IN_GEMV=1)"
		}
		testGreedyCases(t, onGPU, engine.CacheFP8DSMLA, genCases, tag)
	}
}
