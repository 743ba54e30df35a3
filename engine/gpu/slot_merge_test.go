package gpu

import (
	"bytes"
	"fmt"
	"testing"

	"github.com/tilert-go/tilert/engine"
	"github.com/tilert-go/tilert/engine/internal/enginetest"
)

// TILERT_GPU_SLOT_MERGE=1: the indexer scores, the top-k, the fp8 MLA
// decode and the attention epilogue (its cache writes) run once for the
// rows of all slots (each row on its slot's cache through the step's row
// bases) and must give the tokens of one launch per slot: three slots (one
// within index_topk, two past it, so the indexer scores and selects), with
// and without MTP. The step must launch them fewer times, the epilogue as
// often as the MLA decode in every run (once per layer merged, once per
// group per slot). On the emulator every slot's exported cache must also
// be the same bytes (a row writing another slot's cache shows there even
// where the tokens survive it); on a GPU the merged MLA may split its sums
// otherwise, so there the caches are only compared in the log.
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
				var caches [2][][]byte
				var count [2]map[string]int
				for k, on := range []bool{false, true} {
					slotMergeOn = on
					e := newTestEngine(t, kind, src, opts)
					e.m.graphs.keep = [][]gop{}
					params := make([]engine.Params, len(prompts))
					for i := range params {
						params[i].MaxTokens = n
					}
					batch[k] = enginetest.BatchKeep(t, e, prompts, params, nil)
					for s := range prompts {
						caches[k] = append(caches[k], exportBytes(t, e, s))
						e.Release(s)
					}
					count[k] = map[string]int{}
					for r, run := range e.m.graphs.keep {
						c := map[string]int{}
						for _, op := range run {
							c[op.name]++
							count[k][op.name]++
						}
						if epiRowsOn && c["attnEpilogue"] != c["mlaDecode"] {
							t.Errorf("merge=%v run %d: %d attnEpilogue launches, %d mlaDecode (want one with each)", on, r, c["attnEpilogue"], c["mlaDecode"])
						}
					}
				}
				for s := range batch[0] {
					if i := enginetest.FirstDiff(batch[1][s], batch[0][s]); i >= 0 {
						t.Errorf("slot %d: merged tokens differ from per-slot launches at %d:\n got %v\nwant %v", s, i, batch[1][s], batch[0][s])
					}
					if !bytes.Equal(caches[1][s], caches[0][s]) {
						if kind == onEmu {
							t.Errorf("slot %d: merged cache differs from per-slot launches'", s)
						} else {
							t.Logf("slot %d: merged cache differs from per-slot launches' (the MLA's sums may split otherwise)", s)
						}
					}
				}
				for _, name := range []string{"mlaDecode", "indexerScoresQ", "topK", "attnEpilogue"} {
					t.Logf("%s %s launches: %d per slot, %d merged", kind, name, count[0][name], count[1][name])
					if count[1][name] >= count[0][name] {
						t.Errorf("%s launches: %d per slot, %d merged (want fewer)", name, count[0][name], count[1][name])
					}
				}
			})
		}
	}
}
