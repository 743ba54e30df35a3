package gpu

import (
	"bytes"
	"math"
	"testing"

	"github.com/cockroachdb/errors"

	"github.com/tilert-go/tilert/cuda"
	"github.com/tilert-go/tilert/engine"
	"github.com/tilert-go/tilert/engine/internal/enginetest"
)

// fakeEvents is an eventer over a device clock the test moves by hand:
// Record stamps an event with now.
type fakeEvents struct {
	now       float32
	next      cuda.Event
	stamp     map[cuda.Event]float32
	destroyed int
}

func (f *fakeEvents) NewEvent() (cuda.Event, error) {
	f.next++
	return f.next, nil
}

func (f *fakeEvents) Record(e cuda.Event, _ cuda.Stream) error {
	if f.stamp == nil {
		f.stamp = map[cuda.Event]float32{}
	}
	f.stamp[e] = f.now
	return nil
}

func (f *fakeEvents) Elapsed(a, b cuda.Event) (float32, error) {
	ta, oka := f.stamp[a]
	tb, okb := f.stamp[b]
	if !oka || !okb {
		return 0, errors.New("event never recorded")
	}
	return tb - ta, nil
}

func (f *fakeEvents) DestroyEvent(cuda.Event) error { f.destroyed++; return nil }

// TestDevClockSegments: the clock opens a segment at the first work after a
// wait (repeated touches add nothing), closes it at the next wait (a wait
// with nothing queued adds nothing), and adds up the segments (busy) and
// the first start to the last end (span); every event is released.
func TestDevClockSegments(t *testing.T) {
	f := &fakeEvents{}
	var k devClock
	k.bind(f, 7)
	k.cut() // a wait before any work: no segment
	f.now = 1
	k.touch() // segment 1 starts at 1
	f.now = 2
	k.touch()
	f.now = 11
	k.cut() // ends at 11: 10 ms busy
	k.cut()
	f.now = 15 // idle 4 ms while the host works
	k.touch()
	f.now = 20
	k.cut() // 5 ms busy
	f.now = 20.5
	k.touch()
	f.now = 21
	k.cut() // 0.5 ms busy
	span, busy, segs, err := k.finish(f)
	if err != nil {
		t.Fatal(err)
	}
	if segs != 3 || math.Abs(busy-15.5) > 1e-6 || math.Abs(span-20) > 1e-6 {
		t.Errorf("segments %d, busy %g ms, span %g ms; want 3, 15.5, 20", segs, busy, span)
	}
	if f.destroyed != 6 {
		t.Errorf("%d events released, want 6", f.destroyed)
	}
	pc := PrefillClock{WallMs: 23, SpanMs: span, BusyMs: busy, Segments: segs}
	if pc.IdleMs() != 4.5 || pc.HostMs() != 3 {
		t.Errorf("idle %g, host %g; want 4.5, 3", pc.IdleMs(), pc.HostMs())
	}
	// A segment left open (a run that did not cut before its sync) is an
	// error, not a number.
	var open devClock
	open.bind(f, 7)
	open.touch()
	if _, _, _, err := open.finish(f); err == nil {
		t.Error("an open segment was timed")
	}
	// Nothing timed: zeros.
	var none devClock
	if span, busy, segs, err := none.finish(f); err != nil || span != 0 || busy != 0 || segs != 0 {
		t.Errorf("empty clock: %g %g %d %v", span, busy, segs, err)
	}
}

func TestEmuClockPrefill(t *testing.T) { testClockPrefill(t, onEmu) }
func TestGPUClockPrefill(t *testing.T) { testClockPrefill(t, onGPU) }

// testClockPrefill: ClockPrefill leaves the same first token and the same
// cache bytes as Prefill (the GEMM prefill with its grouped MoE, two
// chunks); on the GPU its times are ordered busy <= span <= wall with at
// least one segment per chunk, on the emulator only the wall time is set.
func testClockPrefill(t *testing.T, kind deviceKind) {
	withGemm(t)
	for _, pr := range enginetest.Presets {
		t.Run(pr, func(t *testing.T) {
			w, src := hfSourceOf(t, enginetest.PresetDir(t, pr))
			vocab := w.Config().VocabSize
			ge := newTestEngine(t, kind, src, engine.Options{MaxSeqLen: maxSeq, Slots: 1})
			prompt := make([]int, 80)
			for i := range prompt {
				prompt[i] = (i*7919 + 13) % (vocab * 3 / 4)
			}
			state := func() []byte {
				_, segs, err := ge.Export(0)
				if err != nil {
					t.Fatal(err)
				}
				var b bytes.Buffer
				for _, s := range segs {
					b.Write(s.Data)
				}
				ge.Release(0)
				return b.Bytes()
			}
			want, err := ge.Prefill(0, prompt, engine.Params{})
			if err != nil {
				t.Fatal(err)
			}
			wantState := state()
			got, pc, err := ge.ClockPrefill(0, prompt, engine.Params{})
			if err != nil {
				t.Fatalf("%+v", err)
			}
			if same := bytes.Equal(state(), wantState); got != want || !same {
				t.Errorf("ClockPrefill: first token %d (Prefill %d), same cache bytes %v", got, want, same)
			}
			t.Logf("%s %s: wall %.3f ms, device busy %.3f ms in %d segments, span %.3f ms", kind, pr, pc.WallMs, pc.BusyMs, pc.Segments, pc.SpanMs)
			if pc.WallMs <= 0 {
				t.Errorf("wall time %g", pc.WallMs)
			}
			if kind == onEmu {
				if pc.Segments != 0 || pc.SpanMs != 0 || pc.BusyMs != 0 {
					t.Errorf("emulator: device times %+v", pc)
				}
				return
			}
			// Two chunks, each with a host wait at its MoE layers' ids; the
			// pick's token download; the end.
			if pc.Segments < 3 || pc.BusyMs <= 0 || pc.BusyMs > pc.SpanMs+1e-3 || pc.SpanMs > pc.WallMs {
				t.Errorf("clock %+v: want >= 3 segments and 0 < busy <= span <= wall", pc)
			}
		})
	}
}
