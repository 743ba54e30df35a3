package gpu

import (
	"reflect"
	"strings"
	"testing"

	"github.com/cockroachdb/errors"

	"github.com/tilert-go/tilert/cuda/cupti"
	"github.com/tilert-go/tilert/cuda/kernels"
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
	recs, err := traceRuns(tr, loggedGrapher{tr: tr}, nil, runs, 2, func() error { return nil }, nil)
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
	if _, err := traceRuns(tr2, loggedGrapher{tr: tr2}, nil, runs, 1, func() error { return nil }, nil); err == nil || tr2.on {
		t.Errorf("failing replay: err %v, tracer still on %v", err, tr2.on)
	}
	if _, err := traceRuns(&clockTracer{}, emuGrapher{}, nil, nil, 1, func() error { return nil }, nil); err == nil {
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
	if _, err := traceRuns(tr3, emuGrapher{}, nil, [][]gop{{op("a", nil), lose}}, 2, func() error { return nil }, nil); err == nil ||
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

// The last-replay hooks run around the traced replay only: before it once
// the warm replays are done, after it once it is.
func TestTraceRunsLastReplay(t *testing.T) {
	tr := &clockTracer{}
	op := func(name string) gop {
		return gop{name: name, run: func(device) error { tr.kernel(name); tr.events = append(tr.events, name); return nil }}
	}
	last := &lastReplay{
		before: func() error { tr.events = append(tr.events, "arm"); return nil },
		after:  func() error { tr.events = append(tr.events, "read"); return nil },
	}
	if _, err := traceRuns(tr, emuGrapher{}, nil, [][]gop{{op("a"), op("b")}}, 2, func() error { return nil }, last); err != nil {
		t.Fatal(err)
	}
	if got, want := strings.Join(tr.events, " "), "start a b a b arm a b read stop"; got != want {
		t.Errorf("events %q, want %q", got, want)
	}
	tr = &clockTracer{}
	last.before = func() error { return errors.New("no buffer") }
	if _, err := traceRuns(tr, emuGrapher{}, nil, [][]gop{{op("a")}}, 1, func() error { return nil }, last); err == nil || tr.on {
		t.Errorf("failing arm: err %v, tracer still on %v", err, tr.on)
	}
}

func TestAttachBlockClocks(t *testing.T) {
	k := func(name string, start, end uint64, grid int32) cupti.KernelRecord {
		return cupti.KernelRecord{Name: name, Start: start, End: end, Grid: [3]int32{grid, 1, 1}}
	}
	// CUPTI's times run 1000 ns ahead of the blocks' timer.
	recs := []cupti.KernelRecord{
		k("gemv", 1000, 1100, 2), k("norm", 1050, 1200, 1), k("gemv", 2000, 2100, 2), k("gemv", 2010, 2050, 3), k("solo", 3000, 3100, 2),
	}
	c := func(name string, n, blk, sm uint32, in, rel, out uint64) kernels.BlockClock {
		return kernels.BlockClock{NameHash: kernels.NameHash(name), Blocks: n, Block: blk, SM: sm, Entry: in, Released: rel, Exit: out}
	}
	clocks := []kernels.BlockClock{
		// gemv x2, two launches: entries out of order.
		c("gemv", 2, 0, 0, 1002, 1010, 1090), c("gemv", 2, 0, 1, 0, 20, 60), c("gemv", 2, 1, 1, 1000, 1008, 1080), c("gemv", 2, 1, 5, 1, 30, 100),
		// norm: one block.
		c("norm", 1, 0, 7, 50, 120, 200),
		// gemv x3 alongside: its own grid size.
		c("gemv", 3, 0, 2, 1010, 1011, 1040), c("gemv", 3, 1, 3, 1011, 1012, 1045), c("gemv", 3, 2, 4, 1012, 1013, 1050),
		// solo: block 0 twice, block 1 lost.
		c("solo", 2, 0, 0, 2000, 2001, 2002), c("solo", 2, 0, 1, 2000, 2001, 2003),
	}
	m := attachBlockClocks(recs, clocks)
	if m.Records != 10 || m.Launches != 5 || m.Matched != 4 || len(m.Unmatched) != 1 || !strings.HasPrefix(m.Unmatched[0], "solo x2") {
		t.Fatalf("match %+v", m)
	}
	if m.OffsetNs != 1000 || m.TimerStepNs != 1 {
		t.Errorf("offset %d, timer step %d; want 1000, 1", m.OffsetNs, m.TimerStepNs)
	}
	br := func(blk, sm int, in, rel, out int64) cupti.BlockRun {
		return cupti.BlockRun{Block: blk, SM: sm, In: in, Released: rel, Out: out}
	}
	want := []*cupti.BlockTimes{
		{Blocks: 2, SMs: 2, FirstIn: 1000, LastIn: 1001, FirstReleased: 1020, LastReleased: 1030, FirstOut: 1060, LastOut: 1100, RunP50Ns: 40,
			Each: []cupti.BlockRun{br(0, 1, 1000, 1020, 1060), br(1, 5, 1001, 1030, 1100)}},
		{Blocks: 1, SMs: 1, FirstIn: 1050, LastIn: 1050, FirstReleased: 1120, LastReleased: 1120, FirstOut: 1200, LastOut: 1200, RunP50Ns: 80,
			Each: []cupti.BlockRun{br(0, 7, 1050, 1120, 1200)}},
		{Blocks: 2, SMs: 2, FirstIn: 2000, LastIn: 2002, FirstReleased: 2008, LastReleased: 2010, FirstOut: 2080, LastOut: 2090, RunP50Ns: 72,
			Each: []cupti.BlockRun{br(0, 0, 2002, 2010, 2090), br(1, 1, 2000, 2008, 2080)}},
		{Blocks: 3, SMs: 3, FirstIn: 2010, LastIn: 2012, FirstReleased: 2011, LastReleased: 2013, FirstOut: 2040, LastOut: 2050, RunP50Ns: 33,
			Each: []cupti.BlockRun{br(0, 2, 2010, 2011, 2040), br(1, 3, 2011, 2012, 2045), br(2, 4, 2012, 2013, 2050)}},
		nil,
	}
	for i, w := range want {
		got := recs[i].Blocks
		if !reflect.DeepEqual(got, w) {
			t.Errorf("%s launch %d: blocks %+v, want %+v", recs[i].Name, i, got, w)
		}
	}
}

// TestAttachBlockMarks: a marked kernel's marks records go to the launch
// whose block ran on that SM, with that index, when the marks were taken;
// labels from kernels.MarkLabels, times from the block's release, the
// median block's over a launch; a marks record of another SM, index or
// time, or with no mark taken, goes nowhere.
func TestAttachBlockMarks(t *testing.T) {
	const name = "topk_radix_one_w12"
	labels := kernels.MarkLabels(name)
	if len(labels) < 3 {
		t.Fatalf("MarkLabels(%q) = %v", name, labels)
	}
	recs := []cupti.KernelRecord{
		{Name: name, Start: 1000, End: 1100, Grid: [3]int32{1, 1, 1}},
		{Name: name, Start: 2000, End: 2100, Grid: [3]int32{1, 1, 1}},
		{Name: "indexer_scores_wgh2", Start: 900, End: 990, Grid: [3]int32{3, 1, 1}},
	}
	c := func(name string, n, blk, sm uint32, in, rel, out uint64) kernels.BlockClock {
		return kernels.BlockClock{NameHash: kernels.NameHash(name), Blocks: n, Block: blk, SM: sm, Entry: in, Released: rel, Exit: out}
	}
	mk := func(n, blk, sm uint32, ts ...uint64) kernels.BlockClock {
		r := kernels.BlockClock{NameHash: kernels.MarksTag, Blocks: n, Block: blk, SM: sm}
		copy(r.Marks[:], ts)
		return r
	}
	clocks := []kernels.BlockClock{
		c(name, 1, 0, 4, 0, 10, 100), c(name, 1, 0, 4, 1000, 1020, 1090),
		mk(1, 0, 4, 1030, 1040, 0, 1060), // the second launch's (mark 2 not taken)
		mk(1, 0, 4, 15, 25, 35),          // the first's
		mk(1, 0, 5, 16, 26, 36),          // another SM
		mk(1, 0, 4),                      // nothing taken
		c("indexer_scores_wgh2", 3, 0, 1, 0, 5, 50), c("indexer_scores_wgh2", 3, 1, 2, 0, 6, 60), c("indexer_scores_wgh2", 3, 2, 3, 0, 7, 70),
		mk(3, 0, 1, 9, 20), mk(3, 1, 2, 12, 30), mk(3, 2, 3, 10, 40),
	}
	m := attachBlockClocks(recs, clocks)
	if m.Matched != 3 || len(m.Unmatched) != 0 {
		t.Fatalf("match %+v", m)
	}
	at := func(l string, ns int64) cupti.MarkAt { return cupti.MarkAt{Label: l, Ns: ns} }
	st := func(l string, b int, ns int64) cupti.MarkStat { return cupti.MarkStat{Label: l, Blocks: b, P50Ns: ns} }
	if got, want := recs[0].Blocks.Marks, []cupti.MarkStat{st(labels[0], 1, 5), st(labels[1], 1, 15), st(labels[2], 1, 25)}; !reflect.DeepEqual(got, want) {
		t.Errorf("first launch marks %+v, want %+v", got, want)
	}
	if got, want := recs[1].Blocks.Each[0].Marks, []cupti.MarkAt{at(labels[0], 10), at(labels[1], 20), at(labels[3], 40)}; !reflect.DeepEqual(got, want) {
		t.Errorf("second launch's block marks %+v, want %+v", got, want)
	}
	sl := kernels.MarkLabels("indexer_scores_wgh2")
	if got, want := recs[2].Blocks.Marks, []cupti.MarkStat{st(sl[0], 3, 4), st(sl[1], 3, 24)}; !reflect.DeepEqual(got, want) {
		t.Errorf("scores marks %+v, want %+v", got, want)
	}
}
