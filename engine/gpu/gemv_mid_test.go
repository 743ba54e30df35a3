package gpu

import (
	"fmt"
	"testing"

	"github.com/tilert-go/tilert/cuda/kernels"
	"github.com/tilert-go/tilert/engine"
	"github.com/tilert-go/tilert/engine/internal/enginetest"
)

// TILERT_GPU_GEMV_MID=1 and =2 (gemv_mid.go) must give exactly the tokens and
// cache bytes of the separate launches (TILERT_GPU_GROUP=0, switch off):
// one slot with and without MTP, two slots batched; and the one-row step
// graphs must hold the extra grouped launch (q_b + wq_b) that the switch
// adds. On the GPU the mid kernels must have run.
func TestEmuGemvMidProjections(t *testing.T) { testGemvMidProjections(t, onEmu) }
func TestGPUGemvMidProjections(t *testing.T) { testGemvMidProjections(t, onGPU) }

func testGemvMidProjections(t *testing.T, kind deviceKind) {
	if kind == onGPU {
		gpuDevice(t)
	}
	if !gemvTileOn {
		t.Skip("TILERT_GPU_GEMV_TILE=0: the switch is off with the tile kernels")
	}
	defer func(m, mid string) { groupMode, gemvMidMode = m, mid }(groupMode, gemvMidMode)
	// q_b on the side stream (side.go) leaves the q_b + wq_b group; the
	// group is what this test counts.
	defer func(q bool) { sideQOn = q }(sideQOn)
	sideQOn = false
	// Bits and norm launches are compared: q_a's norm as its own launch
	// (TILERT_GPU_QA_NORM=late removes it; qa_norm_test.go).
	defer func(v bool) { qaNormLate = v }(qaNormLate)
	qaNormLate = false
	n0 := kernels.GroupMidLaunches.Load()
	for _, pr := range enginetest.Presets {
		t.Run(pr, func(t *testing.T) {
			c := newSwitchCase(t, pr)
			for _, mtp := range []bool{false, true} {
				// (group mode, mid mode): the separate launches, the default,
				// mid =1 (q_a's norm in the q_b + wq_b launch), mid =2
				// (rmsnorm, then q_b + wq_b grouped).
				type mode struct {
					group, mid string
				}
				modes := []mode{{"0", ""}, {"", ""}, {"", "1"}, {"", "2"}}
				groups := make([]int, len(modes))
				norms := make([]int, len(modes))
				var ref switchRun
				for k, md := range modes {
					groupMode, gemvMidMode = md.group, md.mid
					r := c.run(t, kind, mtp)
					groups[k], norms[k] = r.ops["gemvGroup"], r.ops["rmsnorm"]
					name := fmt.Sprintf("mtp=%v TILERT_GPU_GROUP=%q TILERT_GPU_GEMV_MID=%q", mtp, md.group, md.mid)
					t.Logf("%s %s: %d grouped launches, %d rmsnorm launches", kind, name, groups[k], norms[k])
					if k == 0 {
						ref = r
						continue
					}
					r.sameAs(t, ref, name, "separate launches")
				}
				// One-row steps (no MTP) group q_b + wq_b too: more grouped
				// launches; with =1 the q_a rmsnorm goes into that launch.
				if !mtp {
					for k := 2; k <= 3; k++ {
						if groups[k] <= groups[1] {
							t.Errorf("mtp=false TILERT_GPU_GEMV_MID=%s: %d grouped launches, the default %d: q_b + wq_b not grouped", modes[k].mid, groups[k], groups[1])
						}
					}
					if norms[2] >= norms[1] || norms[3] != norms[1] {
						t.Errorf("mtp=false: rmsnorm launches %d (=1), %d (=2), the default %d: want fewer with =1, as many with =2", norms[2], norms[3], norms[1])
					}
				}
			}
		})
	}
	if kind == onGPU {
		if n := kernels.GroupMidLaunches.Load() - n0; n == 0 {
			t.Fatal("TILERT_GPU_GEMV_MID=1: no grouped launch ran a gemv_mid_group kernel")
		} else {
			t.Logf("gemv_mid_group ran %d launches", n)
		}
	}
}

// TestGPUGemvMid: greedy decoding == the CPU engine and the goldens with
// TILERT_GPU_GEMV_MID=1 and =2 (set here, whatever the environment), and
// the mid kernels actually ran in each.
func TestGPUGemvMid(t *testing.T) {
	gpuDevice(t)
	if !gemvTileOn {
		t.Skip("TILERT_GPU_GEMV_TILE=0: the switch is off with the tile kernels")
	}
	defer func(m string) { gemvMidMode = m }(gemvMidMode)
	for _, mode := range []string{"1", "2"} {
		t.Run("mode="+mode, func(t *testing.T) {
			gemvMidMode = mode
			n0 := kernels.GroupMidLaunches.Load()
			testGreedyCases(t, onGPU, engine.CacheFP8DSMLA, genCases, " gemv mid="+mode)
			testGolden(t, onGPU)
			n := kernels.GroupMidLaunches.Load() - n0
			if n == 0 {
				t.Fatalf("TILERT_GPU_GEMV_MID=%s: no grouped launch ran a gemv_mid_group kernel", mode)
			}
			t.Logf("TILERT_GPU_GEMV_MID=%s: gemv_mid_group ran %d launches", mode, n)
		})
	}
}
