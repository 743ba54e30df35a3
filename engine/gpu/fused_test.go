package gpu

import (
	"testing"

	"github.com/tilert-go/tilert/engine/internal/enginetest"
)

// The fused per-row launch (TILERT_GPU_FUSE, kernels/fused.go) must give
// what the launches it replaces give: the same tokens and cache bytes, one
// slot and two slots with MTP (several rows and groups per step). The step
// must actually run it: the test counts its launches.
func TestEmuFusedEqualUnfused(t *testing.T) { testFusedEqualUnfused(t, onEmu) }
func TestGPUFusedEqualUnfused(t *testing.T) { testFusedEqualUnfused(t, onGPU) }

func testFusedEqualUnfused(t *testing.T, kind deviceKind) {
	if kind == onGPU {
		gpuDevice(t)
	}
	defer func(on bool) { fuseOn = on }(fuseOn)
	for _, pr := range enginetest.Presets {
		t.Run(pr, func(t *testing.T) {
			c := newSwitchCasePast(t, pr)
			var r [2]switchRun
			for k, on := range []bool{false, true} {
				fuseOn = on
				r[k] = c.run(t, kind, true)
			}
			r[1].sameAs(t, r[0], "fused", "unfused")
			// fused: one epilogue per MLA decode (per layer with the slot
			// merge, else per group; the MLA merges only on mla_decode_tc's
			// family)
			if !slotMergeOn || (mlaTCOn && epiRowsOn) {
				for i, c := range r[1].runs {
					if c["attnEpilogue"] != c["mlaDecode"] {
						t.Errorf("run %d: %d attnEpilogue launches, %d mlaDecode (slot merge %v)", i, c["attnEpilogue"], c["mlaDecode"], slotMergeOn)
					}
				}
			}
			if n := r[0].ops["attnEpilogue"]; n != 0 || r[1].ops["attnEpilogue"] == 0 {
				t.Errorf("attnEpilogue launches: %d unfused, %d fused (want 0 and some)", n, r[1].ops["attnEpilogue"])
			}
			t.Logf("%s launches unfused/fused: rmsnorm %d/%d rope %d/%d mlaCacheWrite %d/%d; attnEpilogue %d",
				kind, r[0].ops["rmsnorm"], r[1].ops["rmsnorm"], r[0].ops["rope"], r[1].ops["rope"], r[0].ops["mlaCacheWrite"],
				r[1].ops["mlaCacheWrite"], r[1].ops["attnEpilogue"])
		})
	}
}
