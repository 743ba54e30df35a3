package gpu

import (
	"fmt"
	"os"
	"strings"
	"testing"
	"text/tabwriter"
	"time"

	"github.com/tilert-go/tilert/engine"
	"github.com/tilert-go/tilert/engine/internal/enginetest"
)

// TestGPUProfileStep prints where a decode step's device time goes on the
// model in $TILERT_PROFILE_MODEL (e.g. the deepseek-v3.2-2layer preset),
// after a 128-token prompt, for 1 and 4 slots, and the host-timed step with
// graphs off and on. Writes the table to $TILERT_PROFILE_OUT too.
func TestGPUProfileStep(t *testing.T) {
	dir := os.Getenv("TILERT_PROFILE_MODEL")
	if dir == "" {
		t.Skip("TILERT_PROFILE_MODEL not set")
	}
	dev := gpuDevice(t)
	src, closeSrc, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer closeSrc()
	var out strings.Builder
	for _, slots := range []int{1, 4} {
		e, err := NewOnDevice(dev, src, engine.Options{Slots: slots, MaxSeqLen: 1024})
		if err != nil {
			t.Fatal(err)
		}
		var ids []int
		for s := 0; s < slots; s++ {
			prompt := enginetest.Prompt(128, e.Config().VocabSize, s+1)
			first, err := e.Prefill(s, prompt, engine.Params{})
			if err != nil {
				t.Fatal(err)
			}
			if _, err := e.Start(s, first, engine.Params{MaxTokens: 400}); err != nil {
				t.Fatal(err)
			}
			ids = append(ids, s)
		}
		wall := func(on bool) float64 {
			e.m.graphs.on = on
			var ts []float64
			for range 24 {
				t0 := time.Now()
				if _, err := e.Step(ids); err != nil {
					t.Fatal(err)
				}
				ts = append(ts, float64(time.Since(t0).Microseconds()))
			}
			return median(ts[4:])
		}
		eager, graph := wall(false), wall(true)
		p, err := e.ProfileStep(ids, 15)
		if err != nil {
			t.Fatal(err)
		}
		fmt.Fprintf(&out, "slots=%d: host-timed step %.0f us eager, %.0f us graphs (median of 20); device: ops alone %.0f us, runs eager %.0f us, runs as graphs %.0f us (%d runs, %d calls)\n",
			slots, eager, graph, p.SumUs, p.EagerUs, p.GraphUs, p.Runs, p.Calls)
		tw := tabwriter.NewWriter(&out, 2, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "op\tcalls\tus\tshare\tMB\tGB/s")
		var bytes int64
		for _, o := range p.Ops {
			bytes += o.Bytes
			fmt.Fprintf(tw, "%s\t%d\t%.1f\t%.1f%%\t%.2f\t%.0f\n", o.Name, o.Count, o.Us, 100*o.Us/p.SumUs, float64(o.Bytes)/1e6, float64(o.Bytes)/o.Us/1e3)
		}
		fmt.Fprintf(tw, "total\t%d\t%.1f\t\t%.2f\t%.0f\n", p.Calls, p.SumUs, float64(bytes)/1e6, float64(bytes)/p.SumUs/1e3)
		tw.Flush()
		out.WriteString("\n")
		if err := e.Close(); err != nil {
			t.Fatal(err)
		}
	}
	t.Log("\n" + out.String())
	if f := os.Getenv("TILERT_PROFILE_OUT"); f != "" {
		if err := os.WriteFile(f, []byte(out.String()), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// The top-k after the scores kernel's histogram consumes (and zeroes) that
// histogram, so the per-call timings (ProfileStep, the TP-8 shard timing)
// run it with the scores call before it: the recorded step must mark it
// and keep the two adjacent. Timed alone, it once read a zeroed histogram
// and wrote past its row on the H200 (TestGPUShardLayerTiming).
func TestEmuTopKAfterHistPairs(t *testing.T) {
	w, src := hfSourceOf(t, enginetest.PresetDir(t, enginetest.Presets[0]))
	cfg := w.Config()
	e := newTestEngine(t, onEmu, src, engine.Options{MaxSeqLen: 256, Slots: 1})
	prompt := enginetest.Prompt(2*cfg.IndexTopK, cfg.VocabSize, 5) // past index_topk: the indexer scores
	first, err := e.Prefill(0, prompt, engine.Params{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.Start(0, first, engine.Params{MaxTokens: 4}); err != nil {
		t.Fatal(err)
	}
	be := e.m
	be.graphs.hold = true
	_, err = e.Step([]int{0})
	runs := be.graphs.keep
	be.graphs.hold, be.graphs.keep = false, nil
	if err != nil {
		t.Fatal(err)
	}
	pairs := 0
	err = be.r.run(func(b device) error {
		for _, run := range runs {
			for i, op := range run {
				f, paired := opAlone(run, i, b)
				if !op.afterPrev {
					continue
				}
				if !paired || run[i-1].name != "indexerScoresQ" {
					return fmt.Errorf("%s at %d of its run follows %q", op.name, i, run[max(i-1, 0)].name)
				}
				pairs++
				for range 2 { // as the timers run it: again and again
					if err := f(); err != nil {
						return err
					}
				}
			}
		}
		return nil
	})
	if err != nil {
		t.Fatalf("%+v", err)
	}
	if want := cfg.NumLayers; pairs < want-1 || pairs > want {
		t.Errorf("%d top-k calls marked as reading the histogram in a %d-layer step", pairs, cfg.NumLayers)
	}
}

// ProfilePrefill runs the same prefill as Prefill (only timed call by
// call): the same first token and cache bytes, every call counted.
func TestEmuProfilePrefill(t *testing.T) {
	withGemm(t)
	testProfilePrefill(t, onEmu)
}

func TestGPUProfilePrefill(t *testing.T) {
	withGemm(t)
	testProfilePrefill(t, onGPU)
}

func testProfilePrefill(t *testing.T, kind deviceKind) {
	if kind == onGPU {
		gpuDevice(t)
	}
	pr := enginetest.Presets[0]
	w, src := hfSourceOf(t, enginetest.PresetDir(t, pr))
	opts := engine.Options{MaxSeqLen: maxSeq, Slots: 2}
	ge := newTestEngine(t, kind, src, opts)
	prompt := genCases(w.Config().VocabSize)[1].prompt
	f1, err := ge.Prefill(0, prompt, engine.Params{})
	if err != nil {
		t.Fatalf("%+v", err)
	}
	f2, prof, err := ge.ProfilePrefill(1, prompt, engine.Params{})
	if err != nil {
		t.Fatalf("%+v", err)
	}
	if f1 != f2 {
		t.Errorf("profiled prefill's first token %d, plain %d", f2, f1)
	}
	_, s1, err := ge.Export(0)
	if err != nil {
		t.Fatal(err)
	}
	_, s2, err := ge.Export(1)
	if err != nil {
		t.Fatal(err)
	}
	for i := range s1 {
		if string(s1[i].Data) != string(s2[i].Data) {
			t.Errorf("segment %d: the profiled prefill's cache bytes differ from the plain one's", i)
		}
	}
	names := map[string]int{}
	calls := 0
	for _, op := range prof.Ops {
		n, _, _ := strings.Cut(op.Name, " ")
		names[n] += op.Count
		calls += op.Count
	}
	if calls != prof.Calls || calls == 0 {
		t.Errorf("%d calls in the rows, %d counted", calls, prof.Calls)
	}
	for _, n := range []string{"gemmFP8", "gemmExperts", "mlaDecode", "absorbQ", "embed"} {
		if names[n] == 0 {
			t.Errorf("no %s call in the profile: %v", n, names)
		}
	}
	if kind == onGPU && prof.SumUs <= 0 {
		t.Errorf("device time %v us", prof.SumUs)
	}
	t.Logf("%d calls, %.0f us; %v", prof.Calls, prof.SumUs, names)
}
