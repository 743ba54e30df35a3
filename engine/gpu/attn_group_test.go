package gpu

import (
	"bytes"
	"fmt"
	"testing"

	"github.com/tilert-go/tilert/engine"
	"github.com/tilert-go/tilert/engine/internal/enginetest"
)

// The grouped attention-input launches (projGroup) must give exactly what
// the separate launches give: tokens and cache bytes, one slot with and
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
	defer func(on bool) { groupOn = on }(groupOn)
	for _, pr := range enginetest.Presets {
		t.Run(pr, func(t *testing.T) {
			w, src := hfSourceOf(t, enginetest.PresetDir(t, pr))
			vocab := w.Config().VocabSize
			n := 12
			prompt := enginetest.Prompt(min(40, w.Config().IndexTopK-n-4), vocab, 7)
			for _, mtp := range []bool{false, true} {
				name := fmt.Sprintf("mtp=%v", mtp)
				opts := engine.Options{MTP: mtp, MaxSeqLen: len(prompt) + n + 16, Slots: 2}
				var toks [2][]int
				var caches [2][]byte
				var batch [2][][]int
				groups := 0
				for k, on := range []bool{false, true} {
					groupOn = on
					e := newTestEngine(t, kind, src, opts)
					e.m.graphs.on, e.m.graphs.hold = true, true
					toks[k] = enginetest.GenerateKeep(t, e, 0, prompt, engine.Params{}, n)
					caches[k] = exportBytes(t, e, 0)
					e.Release(0)
					batch[k] = generateBatch(t, e, [][]int{prompt[:len(prompt)/2], prompt}, engine.Params{}, n)
					for _, run := range e.m.graphs.keep {
						for _, op := range run {
							if op.name == "gemvGroup" {
								if !on {
									t.Fatalf("%s: TILERT_GPU_GROUP=0 but a grouped launch ran", name)
								}
								groups++
							}
						}
					}
					e.m.graphs.hold, e.m.graphs.keep = false, nil
				}
				if groups == 0 {
					t.Errorf("%s: the grouped launches never ran", name)
				}
				if i := enginetest.FirstDiff(toks[1], toks[0]); i >= 0 {
					t.Errorf("%s: grouped tokens differ from separate at %d:\n got %v\nwant %v", name, i, toks[1], toks[0])
				}
				if !bytes.Equal(caches[0], caches[1]) {
					t.Errorf("%s: caches differ between grouped and separate launches", name)
				}
				for s := range batch[0] {
					if i := enginetest.FirstDiff(batch[1][s], batch[0][s]); i >= 0 {
						t.Errorf("%s batched slot %d: grouped tokens differ from separate at %d", name, s, i)
					}
				}
				t.Logf("%s %s: %d grouped launches", kind, name, groups)
			}
		})
	}
}
