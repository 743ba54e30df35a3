package gpu

import (
	"bytes"
	"testing"

	"github.com/tilert-go/tilert/engine"
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
			w, src := hfSourceOf(t, enginetest.PresetDir(t, pr))
			vocab := w.Config().VocabSize
			// past index_topk, so the indexer scores and selects
			prompt := enginetest.Prompt(w.Config().IndexTopK+20, vocab, 7)
			n := 12
			opts := engine.Options{MTP: true, MaxSeqLen: len(prompt) + n + 16, Slots: 2}
			var toks [2][]int
			var caches [2][]byte
			var batch [2][][]int
			var count [2]map[string]int
			for k, on := range []bool{false, true} {
				fuseOn = on
				e := newTestEngine(t, kind, src, opts)
				e.m.graphs.keep = [][]gop{}
				toks[k] = enginetest.GenerateKeep(t, e, 0, prompt, engine.Params{}, n)
				caches[k] = exportBytes(t, e, 0)
				e.Release(0)
				batch[k] = generateBatch(t, e, [][]int{prompt[:len(prompt)-3], prompt}, engine.Params{}, n)
				count[k] = map[string]int{}
				for r, run := range e.m.graphs.keep {
					c := map[string]int{}
					for _, op := range run {
						c[op.name]++
						count[k][op.name]++
					}
					// fused: one epilogue per MLA decode (per layer
					// with the slot merge, else per group; the MLA
					// merges only on mla_decode_tc's family)
					if on && (!slotMergeOn || (mlaTCOn && epiRowsOn)) && c["attnEpilogue"] != c["mlaDecode"] {
						t.Errorf("run %d: %d attnEpilogue launches, %d mlaDecode (slot merge %v)", r, c["attnEpilogue"], c["mlaDecode"], slotMergeOn)
					}
				}
			}
			if i := enginetest.FirstDiff(toks[1], toks[0]); i >= 0 {
				t.Errorf("fused tokens differ from unfused at %d:\n got %v\nwant %v", i, toks[1], toks[0])
			}
			if !bytes.Equal(caches[0], caches[1]) {
				t.Errorf("caches differ between fused and unfused launches")
			}
			for s := range batch[0] {
				if i := enginetest.FirstDiff(batch[1][s], batch[0][s]); i >= 0 {
					t.Errorf("batched slot %d: fused tokens differ from unfused at %d", s, i)
				}
			}
			if n := count[0]["attnEpilogue"]; n != 0 || count[1]["attnEpilogue"] == 0 {
				t.Errorf("attnEpilogue launches: %d unfused, %d fused (want 0 and some)", n, count[1]["attnEpilogue"])
			}
			t.Logf("%s launches unfused/fused: rmsnorm %d/%d rope %d/%d mlaCacheWrite %d/%d; attnEpilogue %d",
				kind, count[0]["rmsnorm"], count[1]["rmsnorm"], count[0]["rope"], count[1]["rope"], count[0]["mlaCacheWrite"],
				count[1]["mlaCacheWrite"], count[1]["attnEpilogue"])
		})
	}
}
