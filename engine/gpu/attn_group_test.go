package gpu

import (
	"fmt"
	"testing"

	"github.com/tilert-go/tilert/engine/internal/enginetest"
)

// The grouped attention-input launches (projGroup, both modes) must give
// exactly what the separate launches give: tokens and cache bytes, one slot with and
// without MTP and two slots batched, while every sequence stays within
// index_topk (the indexer's head weights, whose bf16 GEMV the group runs
// with the tile kernel's arithmetic instead of the wide one's, are then not
// read). The grouped run must actually take the grouped launches.
func TestEmuGroupedProjectionsEqualSeparate(t *testing.T) {
	testGroupedProjections(t, onEmu)
}
func TestGPUGroupedProjectionsEqualSeparate(t *testing.T) { testGroupedProjections(t, onGPU) }

func testGroupedProjections(t *testing.T, kind deviceKind) {
	if kind == onGPU {
		gpuDevice(t)
	}
	defer func(m string) { groupMode = m }(groupMode)
	// Bits are compared: q_a's norm as its own launch (TILERT_GPU_QA_NORM
	// =late scales after the sums; qa_norm_test.go checks its tokens).
	defer func(v bool) { qaNormLate = v }(qaNormLate)
	qaNormLate = false
	for _, pr := range enginetest.Presets {
		t.Run(pr, func(t *testing.T) {
			c := newSwitchCase(t, pr)
			for _, mtp := range []bool{false, true} {
				// Mode "0" is the reference; "" (the default: one grouped
				// launch, the normed q_a's GEMVs separate), "3" (rmsnorm,
				// then q_b and wq_b grouped too) and "2" (both grouped, the
				// norm in the prologue) must match it.
				var ref switchRun
				for k, mode := range []string{"0", "", "3", "2"} {
					groupMode = mode
					r := c.run(t, kind, mtp)
					groups, norms := r.ops["gemvGroup"], r.ops["rmsnorm"]
					name := fmt.Sprintf("mtp=%v TILERT_GPU_GROUP=%q", mtp, mode)
					t.Logf("%s %s: %d grouped launches, %d rmsnorm launches", kind, name, groups, norms)
					if (groups == 0) != (mode == "0") {
						t.Errorf("%s: %d grouped launches", name, groups)
					}
					if k == 0 {
						ref = r
						continue
					}
					r.sameAs(t, ref, name, "separate launches")
				}
			}
		})
	}
}
