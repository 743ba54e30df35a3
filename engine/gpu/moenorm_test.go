package gpu

import (
	"bytes"
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
			w, src := hfSourceOf(t, enginetest.PresetDir(t, pr))
			vocab := w.Config().VocabSize
			prompt := enginetest.Prompt(w.Config().IndexTopK+20, vocab, 7)
			n := 12
			opts := engine.Options{MTP: true, MaxSeqLen: len(prompt) + n + 16, Slots: 2}
			var toks [2][]int
			var caches [2][]byte
			var batch [2][][]int
			var count [2]map[string]int
			for k, on := range []bool{false, true} {
				moeNormOn = on
				e := newTestEngine(t, kind, src, opts)
				e.m.graphs.keep = [][]gop{}
				toks[k] = enginetest.GenerateKeep(t, e, 0, prompt, engine.Params{}, n)
				caches[k] = exportBytes(t, e, 0)
				e.Release(0)
				batch[k] = generateBatch(t, e, [][]int{prompt[:len(prompt)-3], prompt}, engine.Params{}, n)
				count[k] = map[string]int{}
				for _, run := range e.m.graphs.keep {
					for _, op := range run {
						count[k][op.name]++
					}
				}
			}
			if i := enginetest.FirstDiff(toks[1], toks[0]); i >= 0 {
				t.Errorf("fused tokens differ from two launches at %d:\n got %v\nwant %v", i, toks[1], toks[0])
			}
			if !bytes.Equal(caches[0], caches[1]) {
				t.Errorf("caches differ between the fused launch and the two")
			}
			for s := range batch[0] {
				if i := enginetest.FirstDiff(batch[1][s], batch[0][s]); i >= 0 {
					t.Errorf("batched slot %d: fused tokens differ from two launches at %d", s, i)
				}
			}
			f := count[1]["moeCombineNorm"]
			if count[0]["moeCombineNorm"] != 0 || f == 0 {
				t.Errorf("moeCombineNorm launches: %d off, %d on (want 0 and some)", count[0]["moeCombineNorm"], f)
			}
			for _, name := range []string{"moeCombine", "addRMSNorm"} {
				if count[1][name]+f != count[0][name] {
					t.Errorf("%s: %d launches off, %d on beside %d fused (want each fused launch to replace one)",
						name, count[0][name], count[1][name], f)
				}
			}
			t.Logf("%s launches off/on: moeCombine %d/%d addRMSNorm %d/%d; moeCombineNorm %d", kind,
				count[0]["moeCombine"], count[1]["moeCombine"], count[0]["addRMSNorm"], count[1]["addRMSNorm"], f)
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
