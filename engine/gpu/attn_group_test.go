package gpu

import (
	"bytes"
	"fmt"
	"testing"

	"github.com/tilert-go/tilert/engine"
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
	for _, pr := range enginetest.Presets {
		t.Run(pr, func(t *testing.T) {
			w, src := hfSourceOf(t, enginetest.PresetDir(t, pr))
			vocab := w.Config().VocabSize
			n := 12
			prompt := enginetest.Prompt(min(40, w.Config().IndexTopK-n-4), vocab, 7)
			for _, mtp := range []bool{false, true} {
				// Mode "0" is the reference; "" (the default: one grouped
				// launch, the normed q_a's GEMVs separate), "3" (rmsnorm,
				// then q_b and wq_b grouped too) and "2" (both grouped, the
				// norm in the prologue) must match it.
				modes := []string{"0", "", "3", "2"}
				opts := engine.Options{MTP: mtp, MaxSeqLen: len(prompt) + n + 16, Slots: 2}
				toks := make([][]int, len(modes))
				caches := make([][]byte, len(modes))
				batch := make([][][]int, len(modes))
				for k, mode := range modes {
					groupMode = mode
					e := newTestEngine(t, kind, src, opts)
					e.m.graphs.on, e.m.graphs.hold = true, true
					toks[k] = enginetest.GenerateKeep(t, e, 0, prompt, engine.Params{}, n)
					caches[k] = exportBytes(t, e, 0)
					e.Release(0)
					batch[k] = generateBatch(t, e, [][]int{prompt[:len(prompt)/2], prompt}, engine.Params{}, n)
					groups, norms := 0, 0
					for _, run := range e.m.graphs.keep {
						for _, op := range run {
							switch op.name {
							case "gemvGroup":
								groups++
							case "rmsnorm":
								norms++
							}
						}
					}
					e.m.graphs.hold, e.m.graphs.keep = false, nil
					name := fmt.Sprintf("mtp=%v TILERT_GPU_GROUP=%q", mtp, mode)
					t.Logf("%s %s: %d grouped launches, %d rmsnorm launches", kind, name, groups, norms)
					if (groups == 0) != (mode == "0") {
						t.Errorf("%s: %d grouped launches", name, groups)
					}
					if k == 0 {
						continue
					}
					if i := enginetest.FirstDiff(toks[k], toks[0]); i >= 0 {
						t.Errorf("%s: tokens differ from separate launches at %d:\n got %v\nwant %v", name, i, toks[k], toks[0])
					}
					if !bytes.Equal(caches[k], caches[0]) {
						t.Errorf("%s: caches differ from separate launches", name)
					}
					for s := range batch[0] {
						if i := enginetest.FirstDiff(batch[k][s], batch[0][s]); i >= 0 {
							t.Errorf("%s batched slot %d: tokens differ from separate launches at %d", name, s, i)
						}
					}
				}
			}
		})
	}
}
