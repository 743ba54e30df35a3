package gpu

import (
	"fmt"
	"testing"

	"github.com/tilert-go/tilert/engine"
	"github.com/tilert-go/tilert/engine/internal/enginetest"
)

// TILERT_GPU_SLOT_MERGE=1: the indexer scores, the top-k and the fp8 MLA
// decode run once for the rows of all slots (each row on its slot's
// cache through the step's row bases) and must give the tokens of one
// launch per slot: three slots (one within index_topk, two past it, so
// the indexer scores and selects), with and without MTP. The step must
// launch them fewer times.
func TestEmuSlotMergeEqualPerSlot(t *testing.T) { testSlotMerge(t, onEmu) }
func TestGPUSlotMergeEqualPerSlot(t *testing.T) { testSlotMerge(t, onGPU) }

func testSlotMerge(t *testing.T, kind deviceKind) {
	if kind == onGPU {
		gpuDevice(t)
	}
	defer func(on bool) { slotMergeOn = on }(slotMergeOn)
	for _, pr := range enginetest.Presets {
		for _, mtp := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s mtp=%v", pr, mtp), func(t *testing.T) {
				w, src := hfSourceOf(t, enginetest.PresetDir(t, pr))
				vocab := w.Config().VocabSize
				tk := w.Config().IndexTopK
				prompt := enginetest.Prompt(tk+30, vocab, 9)
				prompts := [][]int{prompt[:tk-10], prompt, prompt[:tk+7]}
				n := 10
				opts := engine.Options{MTP: mtp, MaxSeqLen: len(prompt) + n + 16, Slots: 3}
				var batch [2][][]int
				var count [2]map[string]int
				for k, on := range []bool{false, true} {
					slotMergeOn = on
					e := newTestEngine(t, kind, src, opts)
					e.m.graphs.keep = [][]gop{}
					batch[k] = generateBatch(t, e, prompts, engine.Params{}, n)
					count[k] = map[string]int{}
					for _, run := range e.m.graphs.keep {
						for _, op := range run {
							count[k][op.name]++
						}
					}
				}
				for s := range batch[0] {
					if i := enginetest.FirstDiff(batch[1][s], batch[0][s]); i >= 0 {
						t.Errorf("slot %d: merged tokens differ from per-slot launches at %d:\n got %v\nwant %v", s, i, batch[1][s], batch[0][s])
					}
				}
				for _, name := range []string{"mlaDecode", "indexerScoresQ", "topK"} {
					t.Logf("%s %s launches: %d per slot, %d merged", kind, name, count[0][name], count[1][name])
					if count[1][name] >= count[0][name] {
						t.Errorf("%s launches: %d per slot, %d merged (want fewer)", name, count[0][name], count[1][name])
					}
				}
			})
		}
	}
}
