package gpu

import (
	"time"

	"github.com/cockroachdb/errors"

	"github.com/tilert-go/tilert/cuda"
	"github.com/tilert-go/tilert/engine"
)

// PrefillClock is one prefill's wall time beside the device time of the
// same run (ClockPrefill; bench decode --prefill-lens prints it). The run
// is cut at every host wait (a download, a sync, the end) into segments:
// each from the first work queued after the last wait (an event recorded
// before it, by the context's queue hook) to an event recorded before the
// wait.
//
//   - BusyMs: the segments' device times added up. Launch gaps inside a
//     segment count (the device waits for the host's next launch), the
//     time between segments does not.
//   - SpanMs: from the first segment's start to the last one's end: BusyMs
//     plus the device's idle time while the host waited and then worked
//     before queuing more (IdleMs = SpanMs - BusyMs).
//   - WallMs: the host's time for the call; WallMs - SpanMs is the host's
//     work before the first launch and after the last wait (HostMs).
type PrefillClock struct {
	WallMs   float64 `json:"wall_ms"`
	SpanMs   float64 `json:"device_span_ms"`
	BusyMs   float64 `json:"device_busy_ms"`
	Segments int     `json:"segments"`
}

// IdleMs is the device's idle time inside the run (host waits and the
// host's work between them).
func (p PrefillClock) IdleMs() float64 { return p.SpanMs - p.BusyMs }

// HostMs is the host's time outside the device's span.
func (p PrefillClock) HostMs() float64 { return p.WallMs - p.SpanMs }

// ClockPrefill is Prefill timed as PrefillClock says: the wall time of the
// call and the device time of its own work, event-timed. The prefill is the
// same as Prefill's (same launches, same results); the clock adds two event
// records per segment. Device times are those of the GPU; on the emulator
// only WallMs is set.
func (g *Engine) ClockPrefill(slot int, prompt []int, p engine.Params) (int, PrefillClock, error) {
	cr, onGPU := g.m.r.(*cudaRunner)
	var clk *devClock
	if onGPU {
		clk = &devClock{}
		cr.clk = clk
		defer func() { cr.clk = nil }()
	}
	t0 := time.Now()
	first, err := g.Prefill(slot, prompt, p)
	res := PrefillClock{WallMs: float64(time.Since(t0).Nanoseconds()) / 1e6}
	if clk == nil {
		return first, res, err
	}
	var cerr error
	derr := cr.dev.Do(func(c *cuda.Ctx) error {
		res.SpanMs, res.BusyMs, res.Segments, cerr = clk.finish(c)
		return nil
	})
	if err != nil {
		return first, res, err
	}
	return first, res, errors.CombineErrors(derr, cerr)
}

// eventer is what devClock needs of a context (*cuda.Ctx; a fake in the
// tests).
type eventer interface {
	NewEvent() (cuda.Event, error)
	Record(e cuda.Event, s cuda.Stream) error
	Elapsed(start, end cuda.Event) (float32, error)
	DestroyEvent(e cuda.Event) error
}

// devClock cuts the runs it is bound to into segments between host waits
// (PrefillClock). Bound by cudaRunner.runAhead while set on the runner:
// touch runs as the context's queue hook, cut before every host wait of
// cudaDevice (download, downloadAsync, sync, the run's end).
type devClock struct {
	ev   eventer
	s    cuda.Stream
	open bool
	// evs holds each segment's start and end events, in order.
	evs []cuda.Event
	err error
}

// bind points the clock at ev's stream s (the run's main stream).
func (k *devClock) bind(ev eventer, s cuda.Stream) { k.ev, k.s = ev, s }

// record queues a new timing event on the stream.
func (k *devClock) record() {
	if k.err != nil {
		return
	}
	e, err := k.ev.NewEvent()
	if err == nil {
		k.evs = append(k.evs, e)
		err = k.ev.Record(e, k.s)
	}
	k.err = err
}

// touch opens a segment unless one is open: work is about to be queued.
func (k *devClock) touch() {
	if !k.open {
		k.open = true
		k.record()
	}
}

// cut closes the open segment, if any: the host is about to wait.
func (k *devClock) cut() {
	if k.open {
		k.open = false
		k.record()
	}
}

// finish returns the span, the busy time and the segments of the runs
// timed (every event must have completed: each run cut its last segment
// before its closing sync), and releases the events.
func (k *devClock) finish(ev eventer) (spanMs, busyMs float64, segs int, err error) {
	evs := k.evs
	k.evs = nil
	err = k.err
	if err == nil && len(evs)%2 != 0 {
		err = errors.AssertionFailedf("gpu clock: %d events, not start/end pairs", len(evs))
	}
	for i := 0; err == nil && i+1 < len(evs); i += 2 {
		var ms float32
		if ms, err = ev.Elapsed(evs[i], evs[i+1]); err == nil {
			busyMs += float64(ms)
			segs++
		}
	}
	if err == nil && len(evs) >= 2 {
		var ms float32
		ms, err = ev.Elapsed(evs[0], evs[len(evs)-1])
		spanMs = float64(ms)
	}
	for _, e := range evs {
		err = errors.CombineErrors(err, ev.DestroyEvent(e))
	}
	if err != nil {
		return 0, 0, 0, errors.Wrap(err, "timing the prefill's device work")
	}
	return spanMs, busyMs, segs, nil
}
