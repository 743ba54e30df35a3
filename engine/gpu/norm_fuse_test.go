package gpu

import (
	"bytes"
	"fmt"
	"math"
	"testing"

	"github.com/tilert-go/tilert/engine"
	"github.com/tilert-go/tilert/engine/internal/enginetest"
)

// TILERT_GPU_NORM_FUSE=1 and =2 (norm_fuse.go) must give the default path's bits:
// greedy tokens and cache bytes of one slot (with and without MTP), three
// slots batched (3 rows a step without MTP: the grouped launch norms the
// residual; 6 with MTP: past GroupNormRows, the norm runs as its own launch),
// and every teacher-forced logit (prefill chunks of many rows: the norm as
// its own launch) and MTP logit, bit for bit. The decode steps must launch
// fewer addRMSNorm and use the residual combine (both modes) and the
// router's normed launch (=2).
func TestEmuNormFuseEqualDefault(t *testing.T) { testNormFuse(t, onEmu) }
func TestGPUNormFuseEqualDefault(t *testing.T) { testNormFuse(t, onGPU) }

func testNormFuse(t *testing.T, kind deviceKind) {
	if kind == onGPU {
		gpuDevice(t)
	}
	defer func(on, post bool) { normFuseOn, normFusePost = on, post }(normFuseOn, normFusePost)
	modes := []string{"", "1", "2"}
	for _, pr := range enginetest.Presets {
		for _, mtp := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s mtp=%v", pr, mtp), func(t *testing.T) {
				w, src := hfSourceOf(t, enginetest.PresetDir(t, pr))
				vocab := w.Config().VocabSize
				n := 12
				prompt := enginetest.Prompt(min(40, w.Config().IndexTopK-n-4), vocab, 7)
				long := enginetest.Prompt(w.Config().IndexTopK+20, vocab, 9)
				prompts := [][]int{prompt[:len(prompt)/2], prompt, long}
				opts := engine.Options{MTP: mtp, MaxSeqLen: len(long) + n + 16, Slots: 3}
				var toks [3][]int
				var caches [3][]byte
				var batch [3][][]int
				var lg, ml [3][][]float32
				var count [3]map[string]int
				for k, mode := range modes {
					normFuseOn, normFusePost = mode != "", mode == "2"
					e := newTestEngine(t, kind, src, opts)
					var err error
					if lg[k], ml[k], err = e.TeacherForce(0, long[:len(long)-5]); err != nil {
						t.Fatalf("%+v", err)
					}
					e.m.graphs.on, e.m.graphs.hold = true, true
					toks[k] = enginetest.GenerateKeep(t, e, 0, prompt, engine.Params{}, n)
					caches[k] = exportBytes(t, e, 0)
					e.Release(0)
					count[k] = map[string]int{}
					for _, run := range e.m.graphs.keep {
						for _, op := range run {
							count[k][op.name]++
						}
					}
					e.m.graphs.hold, e.m.graphs.keep = false, nil
					batch[k] = generateBatch(t, e, prompts, engine.Params{}, n)
				}
				for k := 1; k < len(modes); k++ {
					name := fmt.Sprintf("TILERT_GPU_NORM_FUSE=%s", modes[k])
					t.Logf("%s %s launches default/fused: addRMSNorm %d/%d rmsnorm %d/%d gemvGroup %d/%d moeCombine %d/%d moeCombineRes %d/%d routerNorm %d/%d",
						kind, name, count[0]["addRMSNorm"], count[k]["addRMSNorm"], count[0]["rmsnorm"], count[k]["rmsnorm"],
						count[0]["gemvGroup"], count[k]["gemvGroup"], count[0]["moeCombine"], count[k]["moeCombine"],
						count[0]["moeCombineRes"], count[k]["moeCombineRes"], count[0]["routerNorm"], count[k]["routerNorm"])
					if count[k]["moeCombineRes"] == 0 || count[k]["addRMSNorm"] >= count[k-1]["addRMSNorm"] || count[0]["moeCombineRes"] != 0 {
						t.Errorf("%s: addRMSNorm %d (before: %d), moeCombineRes %d (default %d): want the residual combine and fewer norms with the switch only",
							name, count[k]["addRMSNorm"], count[k-1]["addRMSNorm"], count[k]["moeCombineRes"], count[0]["moeCombineRes"])
					}
					if (count[k]["routerNorm"] > 0) != (modes[k] == "2") {
						t.Errorf("%s: %d routerNorm launches", name, count[k]["routerNorm"])
					}
					if count[k]["gemvGroup"] != count[0]["gemvGroup"] {
						t.Errorf("%s: grouped launches %d, default %d: want the same", name, count[k]["gemvGroup"], count[0]["gemvGroup"])
					}
					if i := enginetest.FirstDiff(toks[k], toks[0]); i >= 0 {
						t.Errorf("%s: tokens differ from the default at %d:\n got %v\nwant %v", name, i, toks[k], toks[0])
					}
					if !bytes.Equal(caches[k], caches[0]) {
						t.Errorf("%s: caches differ from the default", name)
					}
					for s := range batch[0] {
						if i := enginetest.FirstDiff(batch[k][s], batch[0][s]); i >= 0 {
							t.Errorf("%s batched slot %d: tokens differ from the default at %d:\n got %v\nwant %v", name, s, i, batch[k][s], batch[0][s])
						}
					}
					for _, c := range []struct {
						name string
						a, b [][]float32
					}{{"logits", lg[k], lg[0]}, {"MTP logits", ml[k], ml[0]}} {
						if len(c.a) != len(c.b) {
							t.Fatalf("%s %s: %d positions, default %d", name, c.name, len(c.a), len(c.b))
						}
						diff := 0
						for i := range c.a {
							for j := range c.a[i] {
								if math.Float32bits(c.a[i][j]) != math.Float32bits(c.b[i][j]) {
									diff++
								}
							}
						}
						if diff > 0 {
							t.Errorf("%s %s: %d values differ from the default", name, c.name, diff)
						}
					}
				}
			})
		}
	}
}
