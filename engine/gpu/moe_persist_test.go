package gpu

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"testing"

	"github.com/tilert-go/tilert/engine"
	"github.com/tilert-go/tilert/engine/internal/enginetest"
)

// The persistent MoE launch (TILERT_GPU_MOE_PERSIST=1, moe_persist.go)
// must give what the chain of launches it replaces gives: the same tokens
// and cache bytes over one-slot decode steps (one row a step: MTP off), and
// a batch of two slots (more rows: the chain) must be unchanged. The step
// must actually take it: the test counts its launches in the recorded
// runs and, on the GPU, reads the barrier's generation counter, which only
// the kernel itself advances (4 barriers a launch with the next norm, 3
// deferred).
func TestEmuMoEPersistEqual(t *testing.T) { testMoEPersistEqual(t, onEmu) }
func TestGPUMoEPersistEqual(t *testing.T) { testMoEPersistEqual(t, onGPU) }

func testMoEPersistEqual(t *testing.T, kind deviceKind) {
	if kind == onGPU {
		gpuDevice(t)
	}
	defer func(on bool) { moePersistOn = on }(moePersistOn)
	defer func(on, post bool) { normFuseOn, normFusePost = on, post }(normFuseOn, normFusePost)
	type tcase struct{ pr, norm string }
	var cases []tcase
	for _, pr := range enginetest.Presets {
		// TILERT_GPU_NORM_FUSE unset, =1 (the next norm deferred: the
		// residual add alone) and =2 (o_proj adds into x: no b).
		for _, nf := range []string{"", "1", "2"} {
			cases = append(cases, tcase{pr, nf})
		}
	}
	for _, tc := range cases {
		pr := tc.pr
		normFuseOn, normFusePost = tc.norm != "", tc.norm == "2"
		t.Run(fmt.Sprintf("%s norm_fuse=%q", pr, tc.norm), func(t *testing.T) {
			w, src := hfSourceOf(t, enginetest.PresetDir(t, pr))
			vocab := w.Config().VocabSize
			prompt := enginetest.Prompt(w.Config().IndexTopK+20, vocab, 11)
			n := 12
			opts := engine.Options{MaxSeqLen: len(prompt) + n + 16, Slots: 2}
			var toks [2][]int
			var caches [2][]byte
			var batch [2][][]int
			var count [2]int
			var gen [2]uint32
			for k, on := range []bool{false, true} {
				moePersistOn = on
				e := newTestEngine(t, kind, src, opts)
				e.m.graphs.keep = [][]gop{}
				toks[k] = enginetest.GenerateKeep(t, e, 0, prompt, engine.Params{}, n)
				caches[k] = exportBytes(t, e, 0)
				e.Release(0)
				batch[k] = generateBatch(t, e, [][]int{prompt[:len(prompt)-3], prompt}, engine.Params{}, n)
				for _, run := range e.m.graphs.keep {
					for _, op := range run {
						if op.name == "moePersist" {
							count[k]++
						}
					}
				}
				ctl := make([]byte, 8)
				if err := e.m.r.run(func(b device) error { return b.download(ctl, e.m.ws.pctl) }); err != nil {
					t.Fatalf("%+v", err)
				}
				gen[k] = binary.LittleEndian.Uint32(ctl[4:])
			}
			if i := enginetest.FirstDiff(toks[1], toks[0]); i >= 0 {
				t.Errorf("persistent MoE tokens differ from the chain's at %d:\n got %v\nwant %v", i, toks[1], toks[0])
			}
			if !bytes.Equal(caches[0], caches[1]) {
				t.Errorf("caches differ between the persistent MoE and the chain")
			}
			for s := range batch[0] {
				if i := enginetest.FirstDiff(batch[1][s], batch[0][s]); i >= 0 {
					t.Errorf("batched slot %d: tokens differ from the chain's at %d", s, i)
				}
			}
			if count[0] != 0 || count[1] == 0 {
				t.Errorf("moePersist launches: %d with the switch off, %d on (want 0 and some)", count[0], count[1])
			}
			if kind == onGPU && (gen[0] != 0 || gen[1] == 0) {
				t.Errorf("barrier generation: %d with the switch off, %d on (want 0 and some: the kernel did not run)", gen[0], gen[1])
			}
			t.Logf("%s %s norm_fuse=%q: %d moePersist launches recorded, barrier generation %d", kind, pr, tc.norm, count[1], gen[1])
			after := 0
			if i := enginetest.FirstDiff(toks[1], toks[0]); i >= 0 {
				after = len(toks[0]) - i
			}
			record(t, fmt.Sprintf("%s %s persistent MoE == chain (1-slot tokens, norm_fuse=%q)", kind, pr, tc.norm), "tokens after first mismatch", float64(after), 0)
		})
	}
}
