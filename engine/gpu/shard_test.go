package gpu

import (
	"context"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/cockroachdb/errors"

	"github.com/tilert-go/tilert/converter"
	"github.com/tilert-go/tilert/cuda"
	"github.com/tilert-go/tilert/engine"
	"github.com/tilert-go/tilert/engine/internal/enginetest"
	"github.com/tilert-go/tilert/engine/internal/golden"
	"github.com/tilert-go/tilert/model"
)

// The tensor-parallel engine with N ranks on one device (the emulator in
// CI, the H200 in gpu-check): greedy output equals the unsharded engine's,
// with and without MTP, one slot and four slots in one batch, in exact mode
// everywhere and in serving mode on the emulator; on the GPU, serving mode
// is held to the bounds GPU vs CPU serving meets (TestGPULogitsMatchEmulator:
// the split changes where float32 partial sums are added, and on random
// weights that flips fp8 roundings and top-k near-ties at some positions);
// exact mode meets the HF goldens as the unsharded engine does; state
// imported from the CPU engine decodes the same.

var shardRanks = []int{1, 2, 4, 8}

func newShardTest(t testing.TB, kind deviceKind, src Source, opts engine.Options, n int, comm CommKind) *ShardEngine {
	t.Helper()
	var e *ShardEngine
	var err error
	switch {
	case kind == onGPU:
		e, err = NewShardedOnDevice(gpuDevice(t), src, opts, n, comm)
	case comm == CommLocal:
		e, err = NewShardedEmulated(src, opts, n)
	default: // the one-shot kernels' transcriptions
		e, err = buildShard([]runner{&emuRunner{m: newEmu()}}, make([]int, n), src, opts, comm)
	}
	if err != nil {
		t.Fatalf("%s sharded engine (%d ranks): %+v", kind, n, err)
	}
	t.Cleanup(func() {
		if err := e.Close(); err != nil {
			t.Errorf("close: %+v", err)
		}
	})
	return e
}

func TestEmuShardGreedy(t *testing.T) { testShardGreedy(t, onEmu, CommLocal, engine.ModeServing) }
func TestEmuShardGreedyExact(t *testing.T) {
	testShardGreedy(t, onEmu, CommLocal, engine.ModeExact)
}

// The one-shot communicator on the emulator: the fused all-reduce + add +
// RMSNorm transcription inside the step's replayed graphs.
func TestEmuShardGreedyOneShot(t *testing.T) {
	testShardGreedy(t, onEmu, CommOneShot, engine.ModeServing)
}
func TestGPUShardGreedy(t *testing.T) { testShardGreedy(t, onGPU, CommOneShot, engine.ModeServing) }
func TestGPUShardGreedyExact(t *testing.T) {
	testShardGreedy(t, onGPU, CommOneShot, engine.ModeExact)
}
func TestGPUShardGreedyLocalComm(t *testing.T) {
	testShardGreedy(t, onGPU, CommLocal, engine.ModeServing)
}

// batchPrompts are the sharded greedy checks' four prompts, one a slot;
// the second is longer than index_topk (32), so the indexer selects.
func batchPrompts(vocab int) [][]int {
	return [][]int{
		enginetest.Prompt(9, vocab, 1),
		enginetest.Prompt(80, vocab, 2),
		enginetest.Prompt(17, vocab, 3),
		enginetest.Prompt(40, vocab, 4),
	}
}

func testShardGreedy(t *testing.T, kind deviceKind, comm CommKind, mode engine.Mode) {
	if kind == onGPU {
		gpuDevice(t)
	}
	ranks := shardRanks
	if testing.Short() && kind == onEmu {
		ranks = []int{2, 8}
	}
	for _, pr := range enginetest.Presets {
		t.Run(pr, func(t *testing.T) {
			w, src := hfSourceOf(t, enginetest.PresetDir(t, pr))
			prompts := batchPrompts(w.Config().VocabSize)
			for _, mtp := range []bool{false, true} {
				opts := engine.Options{Mode: mode, MTP: mtp, MaxSeqLen: maxSeq, Slots: 4}
				ref := newTestEngine(t, kind, src, opts)
				want1 := enginetest.Generate(t, ref, 0, prompts[1], engine.Params{}, genTokens)
				want4 := generateBatch(t, ref, prompts, engine.Params{}, genTokens)
				for _, n := range ranks {
					se := newShardTest(t, kind, src, opts, n, comm)
					diff := 0
					report := t.Errorf
					if kind == onGPU && mode == engine.ModeServing {
						report = t.Logf
					}
					got1 := enginetest.Generate(t, se, 0, prompts[1], engine.Params{}, genTokens)
					if i := enginetest.FirstDiff(got1, want1); i >= 0 {
						diff += len(want1) - i
						report("%d ranks mtp=%v one slot: tokens differ from %d:\n got %v\nwant %v", n, mtp, i, got1, want1)
					}
					got4 := generateBatch(t, se, prompts, engine.Params{}, genTokens)
					for i := range want4 {
						if j := enginetest.FirstDiff(got4[i], want4[i]); j >= 0 {
							diff += len(want4[i]) - j
							report("%d ranks mtp=%v 4 slots, slot %d: tokens differ from %d:\n got %v\nwant %v", n, mtp, i, j, got4[i], want4[i])
						}
					}
					if n > 1 && se.s.graphs.on && se.s.graphs.runs.Replays == 0 {
						t.Errorf("%d ranks: no decode step replayed a graph", n)
					}
					st := se.Stats()
					if mtp && st.DraftTokens == 0 {
						t.Errorf("MTP on but nothing drafted")
					}
					name := fmt.Sprintf("%s %s TP-%d (%s) greedy == unsharded %s", kind, pr, n, comm, mode)
					if mtp {
						name += " (MTP)"
					}
					if kind == onGPU && mode == engine.ModeServing {
						// Judged by testShardServingLogits; reported here.
						t.Logf("%s: %d tokens after the first mismatch (not bounded: serving-mode near-ties)", name, diff)
						continue
					}
					record(t, name, "tokens after first mismatch", float64(diff), 0)
				}
			}
		})
	}
}

// The several-GPU path on one GPU: each rank on its own stream, driven as
// ranks on several GPUs are (phases queued without host waits, the device
// drained once per step), with the one-shot communicator across GPUs (flag
// barriers in device memory, every rank's fused all-reduce reading its
// peers' buffers, the selection broadcast, the logits summed by rank 0) and
// with the host-bounce local communicator: greedy output in exact mode
// equals the unsharded engine's, with and without MTP, four slots in one
// batch.
//
// Opt-in (TILERT_GPU_PEER_STREAMS=1) until its present form has run on the
// H200: with the barrier inside the data kernels TP-2 and TP-4 passed there
// and TP-8 hung in a prefill (8 ranks' grids not resident at once on one
// GPU), which the separate one-block barrier launch removes; a hang traps
// after 10 s and leaves the process's CUDA context unusable for the tests
// after it.
func TestGPUShardPeerStreams(t *testing.T) {
	if os.Getenv("TILERT_GPU_PEER_STREAMS") != "1" {
		t.Skip("opt-in: TILERT_GPU_PEER_STREAMS=1 (not yet run on the H200 in this form)")
	}
	dev := gpuDevice(t)
	testShardBatchExact(t, func(t *testing.T, pr string, src Source, opts engine.Options, check shardCheck) {
		for _, comm := range []CommKind{CommOneShot, CommLocal} {
			for _, n := range []int{2, 4, 8} {
				se, err := newShardedOnStreams(dev, src, opts, n, comm)
				if err != nil {
					t.Fatalf("%d ranks on streams (%s): %+v", n, comm, err)
				}
				check(se, fmt.Sprintf("%d ranks (%s)", n, comm), fmt.Sprintf("gpu %s TP-%d on %d streams (%s) greedy == unsharded exact", pr, n, n, comm))
			}
		}
	})
}

// Ranks on several GPUs, one rank per GPU (skipped on a machine with fewer
// than two): TP over 2 GPUs and over all of them (at most 8), through NCCL,
// the one-shot communicator across GPUs (peer-mapped memory, flag barriers)
// and the host-bounce local one: greedy output in exact mode equals the
// unsharded engine's, with and without MTP, four slots in one batch.
func TestGPUShardSeveralGPUs(t *testing.T) {
	gpuDevice(t)
	n, err := cuda.DeviceCount()
	if err != nil || n < 2 {
		t.Skipf("%d GPU(s) here: this needs two or more", n)
	}
	all := make([]int, min(n, 8))
	for i := range all {
		all[i] = i
	}
	testShardBatchExact(t, func(t *testing.T, pr string, src Source, opts engine.Options, check shardCheck) {
		for _, comm := range []CommKind{CommNCCL, CommOneShot, CommLocal} {
			for _, devs := range [][]int{{0, 1}, all} {
				se, err := NewSharded(src, opts, ShardOptions{Devices: devs, Comm: comm})
				if comm == CommNCCL && errors.Is(err, cuda.ErrNoNCCL) {
					t.Logf("no NCCL here: %v", err)
					continue
				}
				if err != nil {
					t.Fatalf("GPUs %v (%s): %+v", devs, comm, err)
				}
				check(se, fmt.Sprintf("GPUs %v (%s)", devs, comm), fmt.Sprintf("gpu %s TP-%d on GPUs %v (%s) greedy == unsharded exact", pr, len(devs), devs, comm))
			}
		}
	})
}

// batchDiff generates with se for prompts in one batch and counts the
// tokens from each slot's first mismatch with want on; what is se in
// error messages.
func batchDiff(t *testing.T, se engine.Engine, prompts, want [][]int, what string, mtp bool) int {
	t.Helper()
	got := generateBatch(t, se, prompts, engine.Params{}, genTokens)
	diff := 0
	for i := range want {
		if j := enginetest.FirstDiff(got[i], want[i]); j >= 0 {
			diff += len(want[i]) - j
			t.Errorf("%s mtp=%v slot %d: tokens differ from %d:\n got %v\nwant %v", what, mtp, i, j, got[i], want[i])
		}
	}
	return diff
}

// shardCheck generates with se, closes it and records its check row name
// (" (MTP)" appended with MTP on); what is se in error messages.
type shardCheck func(se *ShardEngine, what, name string)

// testShardBatchExact runs shards for each preset, with and without MTP: the
// sharded engines it builds for opts (exact mode, four slots), passed to
// check, must generate the unsharded GPU engine's greedy tokens for four
// prompts in one batch.
func testShardBatchExact(t *testing.T, shards func(t *testing.T, pr string, src Source, opts engine.Options, check shardCheck)) {
	for _, pr := range enginetest.Presets {
		t.Run(pr, func(t *testing.T) {
			w, src := hfSourceOf(t, enginetest.PresetDir(t, pr))
			prompts := batchPrompts(w.Config().VocabSize)
			for _, mtp := range []bool{false, true} {
				opts := engine.Options{Mode: engine.ModeExact, MTP: mtp, MaxSeqLen: maxSeq, Slots: 4}
				ref := newTestEngine(t, onGPU, src, opts)
				want := generateBatch(t, ref, prompts, engine.Params{}, genTokens)
				shards(t, pr, src, opts, func(se *ShardEngine, what, name string) {
					diff := batchDiff(t, se, prompts, want, what, mtp)
					if err := se.Close(); err != nil {
						t.Errorf("close: %+v", err)
					}
					if mtp {
						name += " (MTP)"
					}
					record(t, name, "tokens after first mismatch", float64(diff), 0)
				})
			}
		})
	}
}

// Exact mode against the HF goldens, as testGoldenExact runs the
// unsharded engine: teacher-forced logits and MTP logits within
// golden.ExactMaxRelErr, greedy continuations equal to HF's with and
// without MTP.
func TestEmuShardGoldenExact(t *testing.T) { testShardGoldenExact(t, onEmu, CommLocal) }
func TestGPUShardGoldenExact(t *testing.T) {
	testShardGoldenExact(t, onGPU, CommOneShot)
}

func testShardGoldenExact(t *testing.T, kind deviceKind, comm CommKind) {
	gs := enginetest.Goldens(t)
	if kind == onGPU {
		gpuDevice(t)
	}
	ranks := shardRanks
	if testing.Short() && kind == onEmu {
		ranks = []int{4}
	}
	for _, g := range gs {
		t.Run(g.Preset, func(t *testing.T) {
			_, src := hfSourceOf(t, enginetest.GoldenDir(t, g))
			for _, n := range ranks {
				e := newShardTest(t, kind, src, engine.Options{Mode: engine.ModeExact, MaxSeqLen: 1024}, n, comm)
				em := newShardTest(t, kind, src, engine.Options{Mode: engine.ModeExact, MTP: true, MaxSeqLen: 1024}, n, comm)
				var worst, worstM, mis, misM float64
				for _, c := range g.Cases {
					if g.Ambiguous(c.Name) != "" {
						continue
					}
					np := len(c.PromptIDs)
					toks := append(append([]int{}, c.PromptIDs...), c.GreedyIDs...)
					lg, mtp, err := e.TeacherForce(0, toks)
					if err != nil {
						t.Fatalf("%+v", err)
					}
					for s, want := range c.Logits {
						worst = math.Max(worst, golden.RelErr(lg[np-1+s], want))
					}
					for s, want := range c.MTPLogits {
						if np-1+s < len(mtp) {
							worstM = math.Max(worstM, golden.RelErr(mtp[np-1+s], want))
						}
					}
					first := func(got []int) float64 {
						if i := enginetest.FirstDiff(got, c.GreedyIDs); i >= 0 {
							return float64(len(c.GreedyIDs) - i)
						}
						return 0
					}
					mis += first(enginetest.Generate(t, e, 0, c.PromptIDs, engine.Params{}, len(c.GreedyIDs)))
					misM += first(enginetest.Generate(t, em, 0, c.PromptIDs, engine.Params{}, len(c.GreedyIDs)))
				}
				name := fmt.Sprintf("%s %s TP-%d (%s) exact vs HF golden", kind, g.Preset, n, comm)
				record(t, name+": logits (teacher-forced)", "max step max|d|/max|ref|", worst, exactRelBound)
				record(t, name+": MTP logits", "max step max|d|/max|ref|", worstM, exactRelBound)
				record(t, name+": greedy", "tokens after first mismatch", mis, 0)
				record(t, name+": greedy (MTP)", "tokens after first mismatch", misM, 0)
			}
		})
	}
}

// The decode-node handoff on a sharded node: a state produced by the CPU
// engine's prefill (what vLLM ships) is imported through the slot buffer,
// reaches every rank, and decodes as the CPU engine decodes it.
func TestEmuShardImportFromCPU(t *testing.T) { testShardImport(t, onEmu, CommLocal) }
func TestGPUShardImportFromCPU(t *testing.T) {
	testShardImport(t, onGPU, CommOneShot)
}

func testShardImport(t *testing.T, kind deviceKind, comm CommKind) {
	if kind == onGPU {
		gpuDevice(t)
	}
	for _, pr := range enginetest.Presets {
		t.Run(pr, func(t *testing.T) {
			w, src := hfSourceOf(t, enginetest.PresetDir(t, pr))
			opts := engine.Options{MTP: true, MaxSeqLen: maxSeq, Slots: 2}
			ce := newCPU(t, w, opts)
			prompt := enginetest.Prompt(70, w.Config().VocabSize, 5)
			first, err := ce.Prefill(0, prompt, engine.Params{})
			if err != nil {
				t.Fatal(err)
			}
			meta, segs, err := ce.Export(0)
			if err != nil {
				t.Fatal(err)
			}
			want := enginetest.DecodeFrom(t, ce, 0, first, engine.Params{}, genTokens)
			for _, n := range []int{2, 4} {
				se := newShardTest(t, kind, src, opts, n, comm)
				buf, err := se.SlotBuffer(1)
				if err != nil {
					t.Fatal(err)
				}
				for _, sg := range segs {
					copy(buf[sg.Offset:], sg.Data)
				}
				if err := se.Import(1, meta, nil); err != nil {
					t.Fatalf("import: %+v", err)
				}
				got := enginetest.DecodeFrom(t, se, 1, first, engine.Params{}, genTokens)
				diff := 0.0
				if i := enginetest.FirstDiff(got, want); i >= 0 {
					diff = float64(len(want) - i)
					t.Errorf("TP-%d: tokens differ from %d:\n got %v\nwant %v", n, i, got, want)
				}
				record(t, fmt.Sprintf("%s %s TP-%d handoff from CPU prefill (MTP)", kind, pr, n), "tokens after first mismatch", diff, 0)
			}
		})
	}
}

// Bad placements fail with a message and leave nothing behind.
func TestEmuShardRefuses(t *testing.T) {
	_, src := hfSourceOf(t, enginetest.PresetDir(t, enginetest.Presets[0]))
	odd := *src.Config()
	odd.MoEIntermediateSize = 384
	for _, tc := range []struct {
		name string
		err  error
		want string
	}{
		{"no devices", checkDevices(nil), "no devices"},
		{"negative", checkDevices([]int{0, -1}), "device -1"},
		{"too many ranks", checkShardable(src.Config(), 100), "100 ranks"},
		{"moe split off blocks", checkShardable(&odd, 2), "cut a 128-column"},
	} {
		if tc.err == nil || !strings.Contains(tc.err.Error(), tc.want) {
			t.Errorf("%s: got %v, want an error with %q", tc.name, tc.err, tc.want)
		}
	}
	if _, err := NewShardedEmulated(src, engine.Options{}, 0); err == nil {
		t.Error("zero ranks accepted")
	}
}

// failingSource errors on the second read of one tensor: rank 1 of a
// sharded load fails after rank 0 loaded.
type failingSource struct {
	Source
	name  string
	mu    sync.Mutex
	calls int
}

func (s *failingSource) Linear(name string, rows, cols int) (*Matrix, error) {
	if name == s.name {
		s.mu.Lock()
		s.calls++
		n := s.calls
		s.mu.Unlock()
		if n == 2 {
			return nil, errors.Newf("injected read error on %s", name)
		}
	}
	return s.Source.Linear(name, rows, cols)
}

// A load that fails part way leaves nothing allocated on the device.
func TestEmuShardFailedLoadFreesAll(t *testing.T) {
	_, src := hfSourceOf(t, enginetest.PresetDir(t, enginetest.Presets[0]))
	em := newEmu()
	fs := &failingSource{Source: src, name: model.Layer(0).OProj}
	_, err := buildShard([]runner{&emuRunner{m: em}}, make([]int, 4), fs, engine.Options{MaxSeqLen: maxSeq, Slots: 2}, CommLocal)
	if err == nil || !strings.Contains(err.Error(), "injected read error") || !strings.Contains(err.Error(), "rank 1 of 4") {
		t.Fatalf("got %v, want the injected error on rank 1", err)
	}
	if n := len(em.allocs); n != 0 {
		t.Errorf("%d device allocations left after the failed load", n)
	}
	// Four devices loading at once: whichever rank fails, every device is
	// left empty.
	ems := []*emuDevice{newEmu(), newEmu(), newEmu(), newEmu()}
	runners := []runner{&emuRunner{m: ems[0]}, &emuRunner{m: ems[1]}, &emuRunner{m: ems[2]}, &emuRunner{m: ems[3]}}
	fs = &failingSource{Source: src, name: model.Layer(0).OProj}
	_, err = buildShard(runners, []int{0, 1, 2, 3}, fs, engine.Options{MaxSeqLen: maxSeq, Slots: 2}, CommLocal)
	if err == nil || !strings.Contains(err.Error(), "injected read error") {
		t.Fatalf("got %v, want the injected error", err)
	}
	for i, m := range ems {
		if n := len(m.allocs); n != 0 {
			t.Errorf("device %d: %d allocations left after the failed load", i, n)
		}
	}
}

// Ranks on several devices, each driven from its own goroutine, with the
// collectives through host memory: greedy output equals the unsharded
// engine's, with and without MTP, four slots in one batch.
func TestEmuShardSeveralDevices(t *testing.T) {
	pr := enginetest.Presets[0]
	if testing.Short() {
		t.Skip("-short")
	}
	w, src := hfSourceOf(t, enginetest.PresetDir(t, pr))
	prompts := batchPrompts(w.Config().VocabSize)
	for _, mtp := range []bool{false, true} {
		opts := engine.Options{MTP: mtp, MaxSeqLen: maxSeq, Slots: 4}
		ref := newTestEngine(t, onEmu, src, opts)
		want := generateBatch(t, ref, prompts, engine.Params{}, genTokens)
		for _, devs := range [][]int{{0, 0, 1, 1}, {0, 1, 2, 3}} {
			se, err := NewShardedEmulatedOn(src, opts, devs)
			if err != nil {
				t.Fatalf("%+v", err)
			}
			diff := batchDiff(t, se, prompts, want, fmt.Sprintf("devices %v", devs), mtp)
			if err := se.Close(); err != nil {
				t.Error(err)
			}
			record(t, fmt.Sprintf("emu %s TP-4 on devices %v greedy == unsharded (MTP %v)", pr, devs, mtp), "tokens after first mismatch", float64(diff), 0)
		}
	}
}

// Serving mode, teacher-forced on the same 100 tokens: the sharded engine's
// logits (main and MTP) against the unsharded engine's, with the bounds and
// the noise baseline of TestGPULogitsMatchEmulator.
func TestEmuShardServingLogits(t *testing.T) { testShardServingLogits(t, onEmu, CommLocal) }
func TestGPUShardServingLogits(t *testing.T) {
	testShardServingLogits(t, onGPU, CommOneShot)
}

func testShardServingLogits(t *testing.T, kind deviceKind, comm CommKind) {
	if kind == onGPU {
		gpuDevice(t)
	}
	for _, pr := range enginetest.Presets {
		t.Run(pr, func(t *testing.T) {
			w, src := hfSourceOf(t, enginetest.PresetDir(t, pr))
			opts := engine.Options{MaxSeqLen: maxSeq}
			toks := enginetest.Prompt(100, w.Config().VocabSize, 5)
			ref := newTestEngine(t, kind, src, opts)
			rl, rm, err := ref.TeacherForce(0, toks)
			if err != nil {
				t.Fatalf("%+v", err)
			}
			el, em := rl, rm
			if kind != onEmu {
				ee := newTestEngine(t, onEmu, src, opts)
				if el, em, err = ee.TeacherForce(0, toks); err != nil {
					t.Fatalf("%+v", err)
				}
			}
			base := noiseBaseline(t, src, toks, el, em)
			for _, n := range []int{2, 4, 8} {
				se := newShardTest(t, kind, src, opts, n, comm)
				sl, sm, err := se.TeacherForce(0, toks)
				if err != nil {
					t.Fatalf("%+v", err)
				}
				st := compareRuns(rl, rm, sl, sm)
				t.Logf("TP-%d: rel logit err over %d main + %d MTP positions: p50 %.3g p99 %.3g max %.3g; > %.0e: %d; top-1 changed %d (noise baseline: %d, %d)",
					n, st.nMain, len(st.errs)-st.nMain, st.quantile(0.5), st.quantile(0.99), st.quantile(1), flipErr, st.big, st.dis, base.big, base.dis)
				tag := fmt.Sprintf("%s %s TP-%d (%s) serving logits vs unsharded", kind, pr, n, comm)
				record(t, tag, "median max|d|/max|ref|", st.quantile(0.5), medianBound)
				record(t, tag, fmt.Sprintf("positions with err > %.0e", flipErr), st.bigFrac(), max(flipFraction, base.bigFrac()))
				record(t, tag, "top-1 disagreeing", st.disFrac(), max(flipFraction, base.disFrac()))
			}
		})
	}
}

// Converted weights (tilert convert): a node of as many ranks as the
// layout's devices, or any node size for --devices 1, decodes as the
// unsharded engine on the HF checkpoint; another rank count is refused with
// a hint.
func TestEmuShardConvertedWeights(t *testing.T) {
	pr := enginetest.Presets[1]
	dir := enginetest.PresetDir(t, pr)
	w, hs := hfSourceOf(t, dir)
	opts := engine.Options{MTP: true, MaxSeqLen: maxSeq}
	ref := newTestEngine(t, onEmu, hs, opts)
	prompt := enginetest.Prompt(60, w.Config().VocabSize, 7)
	want := enginetest.Generate(t, ref, 0, prompt, engine.Params{}, genTokens)
	for _, tc := range []struct{ devices, ranks int }{{2, 2}, {1, 4}, {2, 4}} {
		out := filepath.Join(t.TempDir(), fmt.Sprintf("conv%d", tc.devices))
		if _, err := converter.Convert(context.Background(), converter.Options{ModelDir: dir, SaveDir: out, Devices: tc.devices, AppendMTP: true}); err != nil {
			t.Fatalf("convert: %+v", err)
		}
		cs, closeFn, err := Open(out)
		if err != nil {
			t.Fatalf("%+v", err)
		}
		devs := make([]int, tc.ranks)
		if tc.devices == 1 {
			for i := range devs {
				devs[i] = i // four devices loading from one mapped layout at once
			}
		}
		se, err := NewShardedEmulatedOn(cs, opts, devs)
		if tc.devices > 1 && tc.devices != tc.ranks {
			if err == nil || !strings.Contains(err.Error(), "laid out for 2 devices") || !strings.Contains(errors.FlattenHints(err), "--devices 4") {
				t.Errorf("layout for %d devices on %d ranks: got %v", tc.devices, tc.ranks, err)
			}
			if se != nil {
				_ = se.Close()
			}
			_ = closeFn()
			continue
		}
		if err != nil {
			t.Fatalf("layout for %d devices on %d ranks: %+v", tc.devices, tc.ranks, err)
		}
		got := enginetest.Generate(t, se, 0, prompt, engine.Params{}, genTokens)
		if i := enginetest.FirstDiff(got, want); i >= 0 {
			t.Errorf("converted for %d devices, TP-%d: tokens differ from %d:\n got %v\nwant %v", tc.devices, tc.ranks, i, got, want)
		}
		if err := se.Close(); err != nil {
			t.Error(err)
		}
		_ = closeFn()
	}
}
