package gpu

import (
	"testing"

	"github.com/tilert-go/tilert/engine"
	"github.com/tilert-go/tilert/engine/internal/enginetest"
)

// The MoE router's GEMV through gemvRouter (TILERT_GPU_ROUTER_SMEM, on by
// default) against gemvBF16 (=0): with it on, every router launch of the
// decode steps that gemvBF16 made is a gemvRouter, with it off none is; in
// the emulator (gemvRouter is gemvBF16 there) the tokens and cache bytes
// are the same.
func TestEmuRouterSmem(t *testing.T) { testRouterSmem(t, onEmu) }

// On the GPU the on-chip kernel's outputs differ from the wide GEMV's in
// float32 summation order, so the two settings are held to the CPU
// engine's greedy tokens instead, and kernels.GemvBF16Smem must have run.
func TestGPURouterSmem(t *testing.T) {
	n0 := routerSmemLaunches.Load()
	testRouterSmem(t, onGPU)
	if n := routerSmemLaunches.Load() - n0; n == 0 {
		t.Errorf("gemv_bf16_smem never ran for the router (the tiny presets' routers fit it)")
	}
	defer func(on bool) { routerSmemOn = on }(routerSmemOn)
	for _, on := range []bool{false, true} {
		routerSmemOn = on
		tag := " (TILERT_GPU_ROUTER_SMEM=0)"
		if on {
			tag = " (TILERT_GPU_ROUTER_SMEM=1)"
		}
		testGreedyCases(t, onGPU, engine.CacheFP8DSMLA, genCases, tag)
	}
}

func testRouterSmem(t *testing.T, kind deviceKind) {
	if kind == onGPU {
		gpuDevice(t)
	}
	defer func(on bool) { routerSmemOn = on }(routerSmemOn)
	for _, pr := range enginetest.Presets {
		t.Run(pr, func(t *testing.T) {
			c := newSwitchCasePast(t, pr)
			var r [2]switchRun
			for k, on := range []bool{false, true} {
				routerSmemOn = on
				r[k] = c.run(t, kind, true)
			}
			if kind == onEmu {
				r[1].sameAs(t, r[0], "gemvRouter", "gemvBF16")
			}
			on, off := r[1].ops, r[0].ops
			if off["gemvRouter"] != 0 || on["gemvRouter"] == 0 {
				t.Errorf("gemvRouter launches: %d off, %d on (want 0 and some)", off["gemvRouter"], on["gemvRouter"])
			}
			if on["gemvRouter"]+on["gemvBF16"] != off["gemvBF16"] {
				t.Errorf("gemvBF16 launches: %d off, %d on beside %d gemvRouter (want each router launch moved)",
					off["gemvBF16"], on["gemvBF16"], on["gemvRouter"])
			}
			if on["moeRoute"] != off["moeRoute"] || on["gemvRouter"] > on["moeRoute"] {
				t.Errorf("moeRoute launches %d off, %d on; gemvRouter %d (at most one a routing)", off["moeRoute"], on["moeRoute"], on["gemvRouter"])
			}
			t.Logf("%s launches off/on: gemvBF16 %d/%d, gemvRouter %d, moeRoute %d", kind,
				off["gemvBF16"], on["gemvBF16"], on["gemvRouter"], on["moeRoute"])
		})
	}
}
