package gpu

import (
	"bytes"
	"fmt"
	"testing"

	"github.com/tilert-go/tilert/engine"
	"github.com/tilert-go/tilert/engine/internal/enginetest"
)

// Graph replay must give what eager launches give: tokens and the final
// cache bytes, with and without MTP, greedy and sampled, one slot and
// batched. On the emulator a replay re-runs the recorded calls with their
// recorded arguments, so an argument missing from the key shows here.
func TestEmuGraphsEqualEager(t *testing.T) { testGraphsEqualEager(t, onEmu) }
func TestGPUGraphsEqualEager(t *testing.T) { testGraphsEqualEager(t, onGPU) }

func testGraphsEqualEager(t *testing.T, kind deviceKind) {
	if kind == onGPU {
		gpuDevice(t)
	}
	for _, pr := range enginetest.Presets {
		t.Run(pr, func(t *testing.T) {
			w, src := hfSourceOf(t, enginetest.PresetDir(t, pr))
			vocab := w.Config().VocabSize
			// Crossing index_topk while decoding (the indexer starts
			// scoring: a new run of launches).
			prompt := enginetest.Prompt(w.Config().IndexTopK-8, vocab, 11)
			n := 24
			defer func(v bool) { sampleOne = v }(sampleOne)
			for _, mtp := range []bool{false, true} {
				// Sampled: with the one-block sampler (its counter an
				// argument) and with SampleWide (its counter on the device).
				for _, pc := range []struct {
					p   engine.Params
					one bool
				}{{engine.Params{}, true}, {engine.Params{Temperature: 0.8, TopP: 0.9, TopK: 20, Seed: 5}, true}, {engine.Params{Temperature: 0.8, TopP: 0.9, TopK: 20, Seed: 5}, false}} {
					p := pc.p
					sampleOne = pc.one
					name := fmt.Sprintf("mtp=%v T=%v one-block sampler=%v", mtp, p.Temperature, pc.one)
					opts := engine.Options{MTP: mtp, MaxSeqLen: len(prompt) + n + 16, Slots: 2}
					var toks [2][]int
					var caches [2][]byte
					var batch [2][][]int
					var st [2]*graphs
					for k, on := range []bool{false, true} {
						e := newTestEngine(t, kind, src, opts)
						e.m.graphs.on = on
						toks[k] = enginetest.GenerateKeep(t, e, 0, prompt, p, n)
						caches[k] = exportBytes(t, e, 0)
						e.Release(0)
						batch[k] = generateBatch(t, e, [][]int{prompt[:len(prompt)/2], prompt}, p, 24)
						st[k] = e.m.graphs
					}
					if i := enginetest.FirstDiff(toks[1], toks[0]); i >= 0 {
						t.Errorf("%s: graph tokens differ from eager at %d:\n got %v\nwant %v", name, i, toks[1], toks[0])
					}
					if !bytes.Equal(caches[0], caches[1]) {
						t.Errorf("%s: caches differ between graph replay and eager launches", name)
					}
					for s := range batch[0] {
						if i := enginetest.FirstDiff(batch[1][s], batch[0][s]); i >= 0 {
							t.Errorf("%s batched slot %d: graph tokens differ from eager at %d", name, s, i)
						}
					}
					g := st[1]
					t.Logf("%s %s: %d graph replays, %d captures, %d eager runs", kind, name, g.runs.Replays, g.runs.Captures, g.runs.Eager)
					// A sampled step reads the sampler's counter from the row's
					// position on the device (not a kernel argument, which
					// keyed every step apart and ran it eagerly until session
					// 37), so it replays as a greedy one does.
					if (p.Greedy() || mtp || !pc.one) && (g.runs.Replays < n/2 || g.runs.Captures == 0) {
						t.Errorf("%s: %d replays, %d captures over %d steps: graphs are not being reused", name, g.runs.Replays, g.runs.Captures, n)
					}
					if st[0].runs.Replays != 0 {
						t.Errorf("%s: graphs off but %d replays", name, st[0].runs.Replays)
					}
				}
			}
		})
	}
}

func exportBytes(t *testing.T, e *Engine, slot int) []byte {
	t.Helper()
	_, segs, err := e.Export(slot)
	if err != nil {
		t.Fatal(err)
	}
	var b []byte
	for _, s := range segs {
		b = append(b, s.Data...)
	}
	return b
}

// HostTimes counts the host's share of the steps run through the graph
// cache and starts over at each call.
func TestEmuHostTimes(t *testing.T) {
	w, src := hfSourceOf(t, enginetest.PresetDir(t, enginetest.Presets[0]))
	prompt := enginetest.Prompt(40, w.Config().VocabSize, 3)
	e := newTestEngine(t, onEmu, src, engine.Options{MaxSeqLen: 128, Slots: 1})
	e.HostTimes()
	n := 6
	enginetest.GenerateKeep(t, e, 0, prompt, engine.Params{}, n)
	h := e.HostTimes()
	// Each decode step flushes once, at its token download; prefill runs
	// eagerly outside the graph cache.
	if h.Runs < n-1 || h.RecordNs <= 0 || h.LaunchNs <= 0 || h.WaitNs <= 0 || h.UploadNs <= 0 {
		t.Fatalf("host times after %d steps: %+v", n, h)
	}
	// Every run is counted once: replayed (captures included) or direct.
	if rc := h.RunCounts; rc.Replays+rc.Eager != h.Runs || rc.Captures > rc.Replays || rc.Replays == 0 {
		t.Fatalf("run counts after %d steps: %+v of %d runs", n, rc, h.Runs)
	}
	if h2 := e.HostTimes(); h2 != (HostTimes{}) {
		t.Fatalf("HostTimes did not start a new count: %+v", h2)
	}
}

// replayOnly is a grapher whose replays do nothing: what is left is the
// host's share of a step (recording the calls, keying, looking up).
type replayOnly struct{}

func (replayOnly) capture(run func() error) (graphExec, error) { return struct{}{}, run() }
func (replayOnly) launch(graphExec) error                      { return nil }
func (replayOnly) destroy(graphExec) error                     { return nil }

// BenchmarkEmuStepRecord times recording one decode step's calls and
// finding its graph (deepseek-v3.2-tiny: ~80 calls; the real models record
// ~300 a step, ~110 us on the H200 machine's host before this benchmark).
func BenchmarkEmuStepRecord(b *testing.B) {
	w, src := hfSourceOf(b, enginetest.PresetDir(b, enginetest.Presets[0]))
	prompt := enginetest.Prompt(300, w.Config().VocabSize, 11)
	e := newTestEngine(b, onEmu, src, engine.Options{MaxSeqLen: 1024, Slots: 1})
	enginetest.GenerateKeep(b, e, 0, prompt, engine.Params{}, 4)
	be := e.m
	step := func() error {
		return be.r.run(func(d device) error {
			gb := &graphDevice{device: d, gs: be.graphs, g: replayOnly{}}
			be.forward(&ops{b: gb}, []fwdRow{{s: be.slots[0], tok: 5, pos: 320}}, false, nil)
			return gb.flush()
		})
	}
	for range 3 { // run, capture, then replays
		if err := step(); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		if err := step(); err != nil {
			b.Fatal(err)
		}
	}
}
