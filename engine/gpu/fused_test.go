package gpu

import (
	"bytes"
	"fmt"
	"slices"
	"testing"

	"github.com/tilert-go/tilert/engine"
	"github.com/tilert-go/tilert/engine/internal/enginetest"
)

// The fused per-row launches (TILERT_GPU_FUSE, kernels/fused.go) must give
// what the launches they replace give: the same tokens and cache bytes, one
// slot and two slots with MTP (several rows and groups per step). The step
// must actually run them: the test counts their launches.
func TestEmuFusedEqualUnfused(t *testing.T) { testFusedEqualUnfused(t, onEmu) }
func TestGPUFusedEqualUnfused(t *testing.T) { testFusedEqualUnfused(t, onGPU) }

func testFusedEqualUnfused(t *testing.T, kind deviceKind) {
	if kind == onGPU {
		gpuDevice(t)
	}
	defer func(on, moe, rt bool) { fuseOn, fuseMoE, fuseRouter = on, moe, rt }(fuseOn, fuseMoE, fuseRouter)
	for _, tc := range []struct {
		pr   string
		moe  bool // TILERT_GPU_FUSE=2: the router and combine fusions too
		want []string
	}{
		{enginetest.Presets[0], false, []string{"attnEpilogue"}},
		{enginetest.Presets[1], false, []string{"attnEpilogue"}},
		{enginetest.Presets[0], true, []string{"attnEpilogue", "routerRoute", "moeCombineNorm"}},
		{enginetest.Presets[1], true, []string{"attnEpilogue", "routerRoute", "moeCombineNorm"}},
	} {
		pr := tc.pr
		t.Run(fmt.Sprintf("%s moe=%v", pr, tc.moe), func(t *testing.T) {
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
				fuseOn, fuseMoE, fuseRouter = on, on && tc.moe, on && tc.moe
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
			for _, name := range []string{"attnEpilogue", "routerRoute", "moeCombineNorm"} {
				want := slices.Contains(tc.want, name)
				if count[0][name] != 0 || (count[1][name] > 0) != want {
					t.Errorf("%s launches: %d unfused, %d fused (want 0 and %s)", name, count[0][name], count[1][name],
						map[bool]string{true: "some", false: "none"}[want])
				}
			}
			fused := []string{"attnEpilogue", "routerRoute", "moeCombineNorm"}
			t.Logf("%s launches unfused/fused: rmsnorm %d/%d rope %d/%d mlaCacheWrite %d/%d moeRoute %d/%d addRMSNorm %d/%d; fused %d %d %d",
				kind, count[0]["rmsnorm"], count[1]["rmsnorm"], count[0]["rope"], count[1]["rope"], count[0]["mlaCacheWrite"],
				count[1]["mlaCacheWrite"], count[0]["moeRoute"], count[1]["moeRoute"], count[0]["addRMSNorm"], count[1]["addRMSNorm"],
				count[1][fused[0]], count[1][fused[1]], count[1][fused[2]])
		})
	}
}
