package gpu

import (
	"fmt"
	"sort"

	"github.com/cockroachdb/errors"

	"github.com/tilert-go/tilert/cuda"
	"github.com/tilert-go/tilert/engine"
)

// OpTime is one kind of call in a decode step: how often it ran, the bytes
// it must move at least (weights for GEMVs, summed over its calls) and its
// device time (summed; each call timed alone, back to back).
type OpTime struct {
	Name  string
	Count int
	Bytes int64
	Us    float64
	// InGraphUs is what the step's graphs lose when every call of this
	// row (and a call paired with one, opAlone's afterPrev) is left out:
	// the row's share of the graphed step's critical path, launch gaps
	// included, net of what other work hides (ProfileStep).
	InGraphUs float64
}

// opKey is op's profile row: its kind and, for GEMVs, its shape.
func opKey(op gop) string {
	if op.shape != [3]int{} {
		return fmt.Sprintf("%s %dx%dx%d", op.name, op.shape[0], op.shape[1], op.shape[2])
	}
	return op.name
}

// addOpTime adds one timed call of op to its row in byName (ops of one
// kind and shape share a row).
func addOpTime(byName map[string]*OpTime, op gop, us float64) {
	name := opKey(op)
	o := byName[name]
	if o == nil {
		o = &OpTime{Name: name}
		byName[name] = o
	}
	o.Count++
	o.Bytes += op.bytes
	o.Us += us
}

// StepProfile says where a decode step's device time goes.
type StepProfile struct {
	Ops []OpTime
	// SumUs is the ops' times added up; EagerUs the step's runs launched
	// one call at a time; GraphUs the same runs replayed as graphs (all
	// device time, event-timed, medians over the repetitions).
	SumUs, EagerUs, GraphUs float64
	// PDL: the kernels were launched programmatically (cuda/kernels
	// pdl.go, TILERT_GPU_PDL=1); then GraphPlainUs is GraphUs with every
	// launch plain. Without, GraphPDLUs is GraphUs with programmatic
	// launches (each 0 where the device has none).
	PDL                      bool
	GraphPlainUs, GraphPDLUs float64
	Runs, Calls              int
}

// HostTimes returns the host-side times added up since the last call
// (steps through the graph cache only) and starts a new count.
func (g *Engine) HostTimes() HostTimes {
	var h HostTimes
	// On the device thread that owns the counters, without the closing
	// sync of a run: bench decode reads them between pipelined steps, and
	// a sync there would drain the forward started ahead.
	_ = g.m.r.runAhead(func(device) (bool, error) {
		gs := g.m.graphs
		h, gs.host = gs.host, HostTimes{}
		r, at := gs.runs, gs.runsAt
		h.RunCounts = RunCounts{Replays: r.Replays - at.Replays, Captures: r.Captures - at.Captures, Eager: r.Eager - at.Eager}
		gs.runsAt = r
		return true, nil
	})
	return h
}

// stepRuns runs one Step over ids and returns the device work it queued,
// run by run (graphs held, not replayed from the cache), for the profile
// and the timeline to re-run. The step runs its own forward: AheadOK is
// off while the graphs are held.
func (g *Engine) stepRuns(ids []int) ([][]gop, error) {
	e := g.m
	if err := e.settle(); err != nil {
		return nil, err
	}
	on := e.graphs.on
	e.graphs.on, e.graphs.hold = true, true
	_, err := g.Step(ids)
	runs := e.graphs.keep
	e.graphs.on, e.graphs.hold, e.graphs.keep = on, false, nil
	return runs, err
}

// ProfileStep runs one Step over ids, then re-runs the device work that
// step queued, timing every call alone and each run eagerly and as a graph.
// A diagnostic (GPU only): the re-runs rewrite the slots' latest cache
// entries, so release the slots afterwards.
func (g *Engine) ProfileStep(ids []int, reps int) (*StepProfile, error) {
	e := g.m
	runs, err := g.stepRuns(ids)
	if err != nil {
		return nil, err
	}
	reps = max(reps, 3)
	prof := &StepProfile{Runs: len(runs)}
	byName := map[string]*OpTime{}
	err = e.r.run(func(b device) error {
		cb, ok := b.(*cudaDevice)
		if !ok {
			return errors.New("ProfileStep needs the GPU backend")
		}
		timeIt := func(f func() error) (float64, error) {
			if err := f(); err != nil { // warm: first launches, caches
				return 0, err
			}
			ts := make([]float64, reps)
			for r := range ts {
				us, err := cb.timeOnce(f)
				if err != nil {
					return 0, err
				}
				ts[r] = us
			}
			sort.Float64s(ts)
			return ts[len(ts)/2], nil
		}
		for _, run := range runs {
			all := func() error {
				for _, op := range run {
					if err := op.run(b); err != nil {
						return err
					}
				}
				return nil
			}
			t, err := timeIt(all)
			if err != nil {
				return err
			}
			prof.EagerUs += t
			g := cudaGrapher{cb}
			graphed := func(pdl bool) (float64, error) {
				prev := cb.k.PDL()
				cb.k.SetPDL(pdl)
				x, err := g.capture(all)
				cb.k.SetPDL(prev)
				if err != nil {
					return 0, err
				}
				defer g.destroy(x)
				return timeIt(func() error { return g.launch(x) })
			}
			prof.PDL = cb.k.PDL()
			if t, err = graphed(prof.PDL); err != nil {
				return err
			}
			prof.GraphUs += t
			if cb.k.PDLSupported() { // the same graph with the other kind of launch
				if t, err = graphed(!prof.PDL); err != nil {
					return err
				}
				if prof.PDL {
					prof.GraphPlainUs += t
				} else {
					prof.GraphPDLUs += t
				}
			}
			prevUs := 0.0
			for i, op := range run {
				if op.ctl() {
					continue // a stream fork or join: timed alone, calls run in order
				}
				f, paired := opAlone(run, i, b)
				t, err := timeIt(f)
				if err != nil {
					return errors.Wrapf(err, "timing %s", op.name)
				}
				if paired {
					t = max(0, t-prevUs)
				}
				prevUs = t
				addOpTime(byName, op, t)
				prof.SumUs += t
				prof.Calls++
			}
		}
		// Each row left out of every run's graph in turn: the graphs'
		// loss is the row's cost on the critical path.
		g := cudaGrapher{cb}
		costs, err := inGraphCosts(runs, func(run []gop) (float64, error) {
			return graphUs(g, b, run, timeIt)
		})
		if err != nil {
			return err
		}
		for key, us := range costs {
			if o := byName[key]; o != nil {
				o.InGraphUs = us
			}
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	for _, o := range byName {
		prof.Ops = append(prof.Ops, *o)
	}
	sort.Slice(prof.Ops, func(i, j int) bool { return prof.Ops[i].Us > prof.Ops[j].Us })
	return prof, nil
}

// graphUs captures run's calls as one graph and times its replays with
// timeIt.
func graphUs(g cudaGrapher, b device, run []gop, timeIt func(func() error) (float64, error)) (float64, error) {
	x, err := captureOps(g, b, run)
	if err != nil {
		return 0, err
	}
	t, err := timeIt(func() error { return g.launch(x) })
	return t, errors.CombineErrors(err, g.destroy(x))
}

// inGraphCosts times runs as graphs (timeRun, each run alone) whole and
// with each profile row left out in turn; costs[key] is what leaving the
// row out saves. The buffers keep the recorded step's values, so the calls
// left in read what they read then.
func inGraphCosts(runs [][]gop, timeRun func([]gop) (float64, error)) (map[string]float64, error) {
	sum := func(key string) (float64, error) {
		total := 0.0
		for _, run := range runs {
			r := run
			if key != "" {
				r = knockOut(run, key)
			}
			t, err := timeRun(r)
			if err != nil {
				if key == "" {
					return 0, errors.Wrap(err, "timing the whole runs as graphs")
				}
				return 0, errors.Wrapf(err, "timing the runs without %s", key)
			}
			total += t
		}
		return total, nil
	}
	base, err := sum("")
	if err != nil {
		return nil, err
	}
	costs := map[string]float64{}
	for _, key := range knockKeys(runs) {
		t, err := sum(key)
		if err != nil {
			return nil, err
		}
		costs[key] = base - t
	}
	return costs, nil
}

// knockKeys lists the profile rows of runs' calls (stream forks and joins
// are not rows), in first-seen order.
func knockKeys(runs [][]gop) []string {
	var keys []string
	seen := map[string]bool{}
	for _, run := range runs {
		for _, op := range run {
			if k := opKey(op); !op.ctl() && !seen[k] {
				seen[k] = true
				keys = append(keys, k)
			}
		}
	}
	return keys
}

// knockOut returns run without the calls of row key. A call that reads
// state its predecessor leaves (afterPrev: the top-k after the scores
// kernel's histogram, which it zeroes again) goes with that predecessor
// and takes it along, so no replay leaves the pair's scratch half-written.
func knockOut(run []gop, key string) []gop {
	drop := make([]bool, len(run))
	for i, op := range run {
		if op.ctl() || opKey(op) != key {
			continue
		}
		drop[i] = true
		if op.afterPrev && i > 0 {
			drop[i-1] = true
		}
		if i+1 < len(run) && run[i+1].afterPrev {
			drop[i+1] = true
		}
	}
	kept := make([]gop, 0, len(run))
	for i, op := range run {
		if !drop[i] {
			kept = append(kept, op)
		}
	}
	return kept
}

// opTimer times calls one at a time (ProfilePrefill): each between two
// events, synchronised, so a row's time is the call's device time alone.
type opTimer struct {
	byName map[string]*OpTime
	sumUs  float64
	calls  int
}

// run runs pend in order, each call timed alone on the GPU (on the
// emulator the calls run untimed: the orchestration is what is checked).
func (t *opTimer) run(b device, pend []gop) error {
	cb, ok := b.(*cudaDevice)
	for _, op := range pend {
		if op.ctl() {
			continue // a stream fork or join: timed alone, calls run in order
		}
		us := 0.0
		if ok {
			var err error
			if us, err = cb.timeOnce(func() error { return op.run(b) }); err != nil {
				return errors.Wrapf(err, "timing %s", op.name)
			}
		} else if err := op.run(b); err != nil {
			return err
		}
		addOpTime(t.byName, op, us)
		t.sumUs += us
		t.calls++
	}
	return nil
}

// timeOnce runs f once between two events and returns its device time.
func (b *cudaDevice) timeOnce(f func() error) (float64, error) { return eventUs(b.c, b.s, f) }

// eventUs runs f once on s between two events: its device time in
// microseconds.
func eventUs(c *cuda.Ctx, s cuda.Stream, f func() error) (float64, error) {
	e0, err := c.NewEvent()
	if err != nil {
		return 0, err
	}
	defer c.DestroyEvent(e0)
	e1, err := c.NewEvent()
	if err != nil {
		return 0, err
	}
	defer c.DestroyEvent(e1)
	if err := c.Record(e0, s); err != nil {
		return 0, err
	}
	if err := f(); err != nil {
		return 0, err
	}
	if err := c.Record(e1, s); err != nil {
		return 0, err
	}
	if err := c.EventSync(e1); err != nil {
		return 0, err
	}
	ms, err := c.Elapsed(e0, e1)
	return float64(ms) * 1000, err
}

// runTimed runs f like e.r.run with every device call recorded and, at
// each upload, download or the end, run and timed alone (e.prof).
func (e *backend) runTimed(f func(b device) (bool, error)) error {
	return e.r.runAhead(func(b device) (bool, error) {
		gb := &graphDevice{device: b, gs: newGraphs(), timed: e.prof}
		ahead, err := f(gb)
		if err != nil {
			return false, err
		}
		return ahead, gb.flush()
	})
}

// PrefillProfile says where a prefill's device time goes.
type PrefillProfile struct {
	Ops []OpTime
	// SumUs is the ops' times added up; Calls the calls timed; Chunk the
	// rows per prefill forward.
	SumUs        float64
	Calls, Chunk int
}

// ProfilePrefill prefills prompt into slot (which must be free; it is left
// holding the prompt, as after Prefill) with every device call timed alone,
// and returns the first token and the calls' times by kind and shape. A
// diagnostic: each call waits for the one before, so the sum is above the
// untimed prefill's device time by the launch gaps.
func (g *Engine) ProfilePrefill(slot int, prompt []int, p engine.Params) (int, *PrefillProfile, error) {
	e := g.m
	e.prof = &opTimer{byName: map[string]*OpTime{}}
	defer func() { e.prof = nil }()
	first, err := g.Prefill(slot, prompt, p)
	if err != nil {
		return 0, nil, err
	}
	prof := &PrefillProfile{SumUs: e.prof.sumUs, Calls: e.prof.calls, Chunk: e.chunkLen}
	for _, o := range e.prof.byName {
		prof.Ops = append(prof.Ops, *o)
	}
	sort.Slice(prof.Ops, func(i, j int) bool {
		if prof.Ops[i].Us != prof.Ops[j].Us {
			return prof.Ops[i].Us > prof.Ops[j].Us
		}
		return prof.Ops[i].Name < prof.Ops[j].Name
	})
	return first, prof, nil
}
