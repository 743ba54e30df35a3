package gpu

import (
	"strings"
	"testing"

	"github.com/cockroachdb/errors"

	"github.com/tilert-go/tilert/cuda/cupti"
	"github.com/tilert-go/tilert/engine"
	"github.com/tilert-go/tilert/engine/internal/enginetest"
)

// clockTracer stands in for CUPTI on the CPU: every call run is a kernel
// record stamped with a step counter, so traceRuns' orchestration (trace on
// before the captures, the warm replays left out, stopped on every path)
// is checked without a GPU. The GPU path is cuda/cupti's TestGPUTraceGraph.
type clockTracer struct {
	now    uint64
	on     bool
	recs   []cupti.KernelRecord
	events []string
}

func (c *clockTracer) Start() error { c.on = true; c.events = append(c.events, "start"); return nil }
func (c *clockTracer) Stop() ([]cupti.KernelRecord, error) {
	c.on = false
	c.events = append(c.events, "stop")
	return c.recs, nil
}
func (c *clockTracer) kernel(name string) {
	c.now++
	if c.on {
		c.recs = append(c.recs, cupti.KernelRecord{Name: name, Start: c.now, End: c.now + 1})
	}
}

// loggedGrapher is emuGrapher noting its captures in the tracer's events.
type loggedGrapher struct {
	emuGrapher
	tr *clockTracer
}

func (g loggedGrapher) capture(run func() error) (graphExec, error) {
	g.tr.events = append(g.tr.events, "capture")
	return g.emuGrapher.capture(run)
}

func TestTraceRuns(t *testing.T) {
	tr := &clockTracer{}
	op := func(name string, fail *bool) gop {
		return gop{name: name, run: func(device) error {
			if fail != nil && *fail {
				return errors.New("launch failed")
			}
			tr.kernel(name)
			return nil
		}}
	}
	fail := false
	runs := [][]gop{{op("a", nil), op("b", nil)}, {op("c", &fail)}}
	recs, err := traceRuns(tr, loggedGrapher{tr: tr}, nil, runs, 2, func() error { return nil })
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, r := range recs {
		names = append(names, r.Name)
	}
	// Two warm replays of a, b, c (6 kernels) are left out.
	if got := strings.Join(names, " "); got != "a b c" || len(tr.recs) != 9 {
		t.Errorf("traced %q of %d, want \"a b c\" of 9", got, len(tr.recs))
	}
	if got := strings.Join(tr.events, " "); got != "start capture capture stop" {
		t.Errorf("events %q: the trace must be on before the graphs are made", got)
	}
	// A failing replay still stops the trace.
	tr2 := &clockTracer{}
	tr, fail = tr2, true
	if _, err := traceRuns(tr2, loggedGrapher{tr: tr2}, nil, runs, 1, func() error { return nil }); err == nil || tr2.on {
		t.Errorf("failing replay: err %v, tracer still on %v", err, tr2.on)
	}
	if _, err := traceRuns(&clockTracer{}, emuGrapher{}, nil, nil, 1, func() error { return nil }); err == nil {
		t.Error("no runs: want an error")
	}
	// A kernel lost (or one from elsewhere): the replays do not split.
	tr3 := &clockTracer{}
	tr, fail = tr3, false
	calls := 0
	lose := gop{name: "lost", run: func(device) error {
		if calls++; calls == 1 {
			tr3.kernel("lost") // recorded in the first replay only
		}
		return nil
	}}
	if _, err := traceRuns(tr3, emuGrapher{}, nil, [][]gop{{op("a", nil), lose}}, 2, func() error { return nil }); err == nil ||
		!strings.Contains(err.Error(), "not the same number each") {
		t.Errorf("uneven replays: err %v", err)
	}
}

// TestGPUTimelineStep traces a decode step of the first test preset on the
// GPU: every kernel of the replay comes back, in a graph, and the
// analysis of them adds up.
func TestGPUTimelineStep(t *testing.T) {
	gpuDevice(t)
	if _, err := cupti.Open(); err != nil {
		t.Skipf("no libcupti here (set %s to its path): %v", cupti.EnvLib, err)
	}
	w, src := hfSourceOf(t, enginetest.PresetDir(t, enginetest.Presets[0]))
	vocab := w.Config().VocabSize
	e := newTestEngine(t, onGPU, src, engine.Options{MaxSeqLen: 64, Slots: 2})
	ids := []int{0, 1}
	for _, s := range ids {
		first, err := e.Prefill(s, enginetest.Prompt(9+s, vocab, s), engine.Params{MaxTokens: 16})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := e.Start(s, first, engine.Params{MaxTokens: 16}); err != nil {
			t.Fatal(err)
		}
	}
	for range 3 { // the graph cache's captures happen here, before CUPTI
		if _, err := e.Step(ids); err != nil {
			t.Fatal(err)
		}
	}
	for round := range 2 { // twice: Start/Stop again in one process
		recs, err := e.TimelineStep(ids, 2)
		if err != nil {
			t.Fatalf("%+v", err)
		}
		names := map[string]int{}
		for i, r := range recs {
			names[r.Name]++
			if r.Start >= r.End || r.GraphID == 0 || r.GraphNodeID == 0 || (i > 0 && r.Start < recs[i-1].Start) {
				t.Errorf("round %d: record %d %+v", round, i, r)
			}
		}
		tl, err := cupti.Analyze(recs, cupti.Options{})
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("round %d: %d kernels (%d names), span %d ns, busy %d ns, max concurrent %d, streams %v",
			round, tl.Kernels, len(names), tl.SpanNs, tl.BusyNs, tl.MaxConcurrent, tl.Streams)
		if tl.Kernels < 10 || tl.BusyNs > tl.SpanNs || tl.SpanNs > 1e9 {
			t.Errorf("round %d: %d kernels, span %d busy %d", round, tl.Kernels, tl.SpanNs, tl.BusyNs)
		}
	}
	// The engine still steps afterwards (the slots' latest entries were
	// rewritten; a step still runs).
	if _, err := e.Step(ids); err != nil {
		t.Fatalf("step after the timeline: %+v", err)
	}
}
