package gpu

import (
	"fmt"
	"strings"
	"testing"

	"github.com/cockroachdb/errors"

	"github.com/tilert-go/tilert/engine"
	"github.com/tilert-go/tilert/engine/internal/enginetest"
)

// The pipelined step (ahead.go) must not change what an engine decodes:
// enginetest.Schedule (slots joining, leaving, ending at a stop id and by
// MaxTokens, a seeded sampled slot, Release while a step started ahead runs
// and an Import into the slot just released) gives the same transcript
// with pipelining on as with it off. And the check can fail: with the
// discard path broken (a forward started ahead taken for any step of as
// many rows) the transcript differs.
func TestEmuPipelineMatches(t *testing.T) { testPipelineMatches(t, onEmu, enginetest.Presets) }
func TestGPUPipelineMatches(t *testing.T) { testPipelineMatches(t, onGPU, enginetest.Presets) }

func testPipelineMatches(t *testing.T, kind deviceKind, presets []string) {
	if kind == onGPU {
		gpuDevice(t)
	}
	for _, pr := range presets {
		for _, mtp := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/mtp=%v", pr, mtp), func(t *testing.T) {
				w, src := hfSourceOf(t, enginetest.PresetDir(t, pr))
				vocab := w.Config().VocabSize
				opts := engine.Options{MaxSeqLen: 96, Slots: enginetest.ScheduleSlots, MTP: mtp}
				run := func(off, loose bool, stop int) ([]string, []int, *Engine) {
					e := newTestEngine(t, kind, src, opts)
					e.m.ah.off, e.m.ah.mtp, e.m.ah.loose = off, !off, loose
					tr, s0 := enginetest.Schedule(t, e, vocab, stop)
					return tr, s0, e
				}
				_, s0, _ := run(true, false, -1)
				stop := enginetest.StopFrom(s0, 12)
				if stop < 0 {
					t.Fatalf("no stop id to choose from slot 0's tokens %v", s0)
				}
				want, _, _ := run(true, false, stop)
				// The pipelined step's copies on the main stream
				// (TILERT_GPU_AHEAD_COPY=0), then beside it (the default).
				defer func(on bool) { aheadCopyOn = on }(aheadCopyOn)
				aheadCopyOn = false
				inline, _, _ := run(false, false, stop)
				if i := firstLineDiff(inline, want); i >= 0 {
					t.Fatalf("pipelined transcript (copies on the main stream) differs at line %d:\n got %s\nwant %s", i, lineAt(inline, i), lineAt(want, i))
				}
				aheadCopyOn = true
				got, _, e := run(false, false, stop)
				if i := firstLineDiff(got, want); i >= 0 {
					t.Fatalf("pipelined transcript differs at line %d:\n got %s\nwant %s", i, lineAt(got, i), lineAt(want, i))
				}
				if !strings.Contains(strings.Join(want, "\n"), `finish "stop"`) {
					t.Errorf("the schedule never ended a slot at its stop id %d", stop)
				}
				st := e.m.ah
				t.Logf("%s %s mtp=%v: %d transcript lines, %d forwards started ahead, %d taken, %d picks ahead adjusted", kind, pr, mtp, len(got), st.started, st.taken, st.adjusted)
				if st.taken < len(want)/5 || st.started-st.taken < 2 {
					t.Errorf("%d forwards started ahead, %d taken: the schedule does not exercise both paths", st.started, st.taken)
				}
				if !mtp && st.adjusted < 12 {
					t.Errorf("%d picks ahead with adjustments or logprobs: the penalised slots did not pipeline", st.adjusted)
				}
				broken, _, _ := run(false, true, stop)
				if firstLineDiff(broken, want) < 0 {
					t.Errorf("with the discard path broken the transcript is unchanged: the check cannot fail")
				}
			})
		}
	}
}

// picksInPlace: the embedding reads the picks in place only where every
// row takes a pick and the picks are consecutive.
func TestPicksInPlace(t *testing.T) {
	for _, c := range []struct {
		from []int
		M, p int
		ok   bool
	}{
		{[]int{0}, 1, 0, true},
		{[]int{0, 1, 2, 3}, 4, 0, true},
		{[]int{2, 3}, 2, 2, true},
		{nil, 1, 0, false},
		{[]int{}, 0, 0, false},
		{[]int{0, 1}, 3, 0, false},
		{[]int{-1}, 1, 0, false},
		{[]int{0, -1}, 2, 0, false},
		{[]int{1, 0}, 2, 0, false},
		{[]int{0, 0}, 2, 0, false},
		{[]int{0, 2}, 2, 0, false},
	} {
		p, ok := picksInPlace(c.from, c.M)
		if ok != c.ok || (ok && p != c.p) {
			t.Errorf("picksInPlace(%v, %d) = %d, %v; want %d, %v", c.from, c.M, p, ok, c.p, c.ok)
		}
	}
}

func firstLineDiff(a, b []string) int {
	for i := 0; i < max(len(a), len(b)); i++ {
		if i >= len(a) || i >= len(b) || a[i] != b[i] {
			return i
		}
	}
	return -1
}

func lineAt(s []string, i int) string {
	if i < len(s) {
		return s[i]
	}
	return "(end)"
}

// Every entry point that hands a slot's memory to a writer outside the
// stream waits for the forward started ahead (Release, SlotBuffer and so
// DeviceSlotBuffer), and those that use the device for something else
// discard it (Import, Prefill).
func TestEmuPipelineDrains(t *testing.T) { testPipelineDrains(t, onEmu) }
func TestGPUPipelineDrains(t *testing.T) { testPipelineDrains(t, onGPU) }

func testPipelineDrains(t *testing.T, kind deviceKind) {
	if kind == onGPU {
		gpuDevice(t)
	}
	w, src := hfSourceOf(t, enginetest.PresetDir(t, enginetest.Presets[0]))
	vocab := w.Config().VocabSize
	e := newTestEngine(t, kind, src, engine.Options{MaxSeqLen: 64, Slots: 2})
	e.m.ah.off = false
	p := engine.Params{MaxTokens: 20}
	for s := range 2 {
		first, err := e.Prefill(s, enginetest.Prompt(9+s, vocab, s), p)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := e.Start(s, first, p); err != nil {
			t.Fatal(err)
		}
	}
	step := func(ids ...int) {
		t.Helper()
		if _, err := e.Step(ids); err != nil {
			t.Fatal(err)
		}
		if !e.m.ah.inflight || e.m.ah.rows == nil {
			t.Fatalf("step %v: no forward started ahead (inflight %v)", ids, e.m.ah.inflight)
		}
	}
	check := func(what string, inflight, rows bool) {
		t.Helper()
		if e.m.ah.inflight != inflight || (e.m.ah.rows != nil) != rows {
			t.Errorf("after %s: in flight %v, results kept %v; want %v, %v", what, e.m.ah.inflight, e.m.ah.rows != nil, inflight, rows)
		}
	}
	step(0, 1)
	if _, _, err := e.DeviceSlotBuffer(1); err != nil && !errors.Is(err, errExactDeviceBuffer) {
		t.Fatal(err)
	}
	check("DeviceSlotBuffer", false, true)
	step(0, 1)
	e.Release(1)
	check("Release", false, true)
	step(0)
	meta, segs, err := e.Export(0)
	if err != nil {
		t.Fatal(err)
	}
	check("Export", false, false)
	step(0)
	if err := e.Import(1, meta, segs); err != nil {
		t.Fatal(err)
	}
	check("Import", false, false)
	e.Release(1)
	step(0)
	if _, err := e.Prefill(1, enginetest.Prompt(5, vocab, 9), p); err != nil {
		t.Fatal(err)
	}
	check("Prefill", false, false)
}

// headSpan: one head launch over the wanted rows' span where it is short.
func TestHeadSpan(t *testing.T) {
	T, F := true, false
	long := make([]bool, 40)
	long[0], long[39] = true, true
	for _, c := range []struct {
		want  []bool
		M     int
		a, n  int
		ok    bool
		label string
	}{
		{nil, 3, 0, 3, true, "nil: all rows"},
		{[]bool{T, T, T, T}, 4, 0, 4, true, "every row (a 4-slot MTP forward)"},
		{[]bool{F, T, F, T}, 4, 1, 3, true, "two slots' last MTP rows"},
		{[]bool{F, F, T}, 3, 2, 1, true, "one row"},
		{[]bool{F, F}, 2, 0, 0, false, "none"},
		{long, 40, 0, 0, false, "a span past headSpanMax"},
	} {
		a, n, ok := headSpan(c.want, c.M)
		if ok != c.ok || (ok && (a != c.a || n != c.n)) {
			t.Errorf("%s: headSpan = %d, %d, %v; want %d, %d, %v", c.label, a, n, ok, c.a, c.n, c.ok)
		}
	}
}

// TestEmuMTPHeadOnce: a 3-slot MTP step reads the head twice (the verify's
// rows, then the MTP rows), not once per MTP row as it did until session 46.
func TestEmuMTPHeadOnce(t *testing.T) {
	_, src := hfSourceOf(t, enginetest.PresetDir(t, enginetest.Presets[0]))
	e := newTestEngine(t, onEmu, src, engine.Options{MaxSeqLen: 96, Slots: 3, MTP: true})
	cfg := e.m.cfg
	ids := []int{0, 1, 2}
	for _, s := range ids {
		first, err := e.Prefill(s, []int{3, 5, 7 + s}, engine.Params{})
		if err != nil {
			t.Fatalf("%+v", err)
		}
		if _, err := e.Start(s, first, engine.Params{MaxTokens: 40}); err != nil {
			t.Fatalf("%+v", err)
		}
	}
	for range 3 {
		if _, err := e.Step(ids); err != nil {
			t.Fatalf("%+v", err)
		}
	}
	runs, err := e.stepRuns(ids)
	if err != nil {
		t.Fatalf("%+v", err)
	}
	var heads []string
	for _, run := range runs {
		for _, op := range run {
			if op.shape[0] == cfg.VocabSize && op.shape[1] == cfg.HiddenSize {
				heads = append(heads, fmt.Sprintf("%s %v", op.name, op.shape))
			}
		}
	}
	if len(heads) != 2 {
		t.Errorf("a 3-slot MTP step launched the head %d times, want 2 (the verify's rows, the MTP rows): %v", len(heads), heads)
	}
}
