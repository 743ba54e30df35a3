package gpu

import (
	"testing"

	"github.com/tilert-go/tilert/cuda/kernels"
	"github.com/tilert-go/tilert/engine"
	"github.com/tilert-go/tilert/engine/internal/enginetest"
)

// TestGPUGroupSplit: the split grouped GEMV (TILERT_GPU_GROUP_SPLIT, on by
// default) gives exactly the tokens and cache bytes of gemv_group (=0):
// one slot with and without MTP, two slots batched, on every preset; and
// greedy decoding matches the CPU engine and the goldens with it on. The
// split kernel must have run.
func TestGPUGroupSplit(t *testing.T) {
	gpuDevice(t)
	if !gemvTileOn || groupMode == "0" {
		t.Skip("TILERT_GPU_GEMV_TILE=0 or TILERT_GPU_GROUP=0: no grouped launches")
	}
	defer func(on bool) { groupSplitOn = on }(groupSplitOn)
	n0 := kernels.GroupSplitLaunches.Load()
	for _, pr := range enginetest.Presets {
		t.Run(pr, func(t *testing.T) {
			c := newSwitchCase(t, pr)
			for _, mtp := range []bool{false, true} {
				groupSplitOn = false
				ref := c.run(t, onGPU, mtp)
				groupSplitOn = true
				r := c.run(t, onGPU, mtp)
				name := map[bool]string{false: "mtp=false", true: "mtp=true"}[mtp]
				r.sameAs(t, ref, name+" TILERT_GPU_GROUP_SPLIT on", "=0")
			}
		})
	}
	groupSplitOn = true
	testGreedyCases(t, onGPU, engine.CacheFP8DSMLA, genCases, " group split")
	testGolden(t, onGPU)
	n := kernels.GroupSplitLaunches.Load() - n0
	if n == 0 {
		t.Fatal("TILERT_GPU_GROUP_SPLIT: no grouped launch ran a gemv_group_split kernel")
	}
	t.Logf("gemv_group_split ran %d launches", n)
}
