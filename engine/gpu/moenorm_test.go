package gpu

import (
	"testing"

	"github.com/tilert-go/tilert/engine"
	"github.com/tilert-go/tilert/engine/internal/enginetest"
)

// The MoE combine fused with the layer's closing add + RMSNorm
// (moeCombineNorm, TILERT_GPU_MOE_NORM_FUSED) must give what the two
// launches give: the same tokens and cache bytes, one slot and two slots
// with MTP (1..4 rows a step). The step must run it, each fused launch in
// place of exactly one combine and one addRMSNorm.
func TestEmuMoENormFusedEqual(t *testing.T) { testMoENormFusedEqual(t, onEmu) }
func TestGPUMoENormFusedEqual(t *testing.T) { testMoENormFusedEqual(t, onGPU) }

func testMoENormFusedEqual(t *testing.T, kind deviceKind) {
	if kind == onGPU {
		gpuDevice(t)
	}
	defer func(on bool) { moeNormOn = on }(moeNormOn)
	for _, pr := range enginetest.Presets {
		t.Run(pr, func(t *testing.T) {
			c := newSwitchCasePast(t, pr)
			var r [2]switchRun
			for k, on := range []bool{false, true} {
				moeNormOn = on
				r[k] = c.run(t, kind, true)
			}
			r[1].sameAs(t, r[0], "fused", "two launches")
			f := r[1].ops["moeCombineNorm"]
			if r[0].ops["moeCombineNorm"] != 0 || f == 0 {
				t.Errorf("moeCombineNorm launches: %d off, %d on (want 0 and some)", r[0].ops["moeCombineNorm"], f)
			}
			for _, name := range []string{"moeCombine", "addRMSNorm"} {
				if r[1].ops[name]+f != r[0].ops[name] {
					t.Errorf("%s: %d launches off, %d on beside %d fused (want each fused launch to replace one)",
						name, r[0].ops[name], r[1].ops[name], f)
				}
			}
			t.Logf("%s launches off/on: moeCombine %d/%d addRMSNorm %d/%d; moeCombineNorm %d", kind,
				r[0].ops["moeCombine"], r[1].ops["moeCombine"], r[0].ops["addRMSNorm"], r[1].ops["addRMSNorm"], f)
		})
	}
}

// Greedy decoding equals the CPU engine's with the fused launch and
// without it (the GPU check of the kernel's bits inside the engine).
func TestGPUGreedyMatchesCPUMoENorm(t *testing.T) {
	defer func(on bool) { moeNormOn = on }(moeNormOn)
	for _, on := range []bool{false, true} {
		moeNormOn = on
		tag := " (TILERT_GPU_MOE_NORM_FUSED=0)"
		if on {
			tag = " (TILERT_GPU_MOE_NORM_FUSED=1)"
		}
		testGreedyCases(t, onGPU, engine.CacheFP8DSMLA, genCases, tag)
	}
}
