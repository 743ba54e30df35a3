package gpu

import (
	"fmt"
	"log/slog"
	"math"
	"slices"
	"sort"

	"github.com/cockroachdb/errors"

	"github.com/tilert-go/tilert/cuda"
	"github.com/tilert-go/tilert/cuda/cupti"
	"github.com/tilert-go/tilert/cuda/kernels"
)

// kernelTracer is what traceRuns needs of cupti.Tracer.
type kernelTracer interface {
	Start() error
	Stop() ([]cupti.KernelRecord, error)
}

// TimelineStep runs one Step over ids, then replays the device work that
// step queued as graphs with CUPTI's kernel trace on, and returns the
// kernels of the traced replay as the GPU ran them (by start; side streams
// and graph branches overlap). The runs are replayed warm times first,
// untraced in the result. A diagnostic (GPU only, libcupti needed): like
// ProfileStep, the replays rewrite the slots' latest cache entries, so
// release the slots afterwards. Nothing of CUPTI is loaded until the first
// call.
func (g *Engine) TimelineStep(ids []int, warm int) ([]cupti.KernelRecord, error) {
	tr, err := cupti.Open()
	if err != nil {
		return nil, err
	}
	e := g.m
	runs, err := g.stepRuns(ids)
	if err != nil {
		return nil, err
	}
	var recs []cupti.KernelRecord
	err = e.r.run(func(b device) (err error) {
		cb, ok := b.(*cudaDevice)
		if !ok {
			return errors.New("TimelineStep needs the GPU backend")
		}
		var hooks *lastReplay
		var clocks []kernels.BlockClock
		if kernels.BlockClocks {
			var done func() error
			hooks, done = cb.blockClockHooks(&clocks)
			defer func() { err = errors.CombineErrors(err, done()) }()
		}
		recs, err = traceRuns(tr, cudaGrapher{cb}, b, runs, warm, func() error { return cb.c.SyncStream(cb.s) }, hooks)
		if err == nil && hooks != nil {
			s := attachBlockClocks(recs, clocks)
			slog.Info("timeline: block clocks", "records", s.Records, "lost", hooks.lost, "launches", s.Launches,
				"matched", s.Matched, "unmatched", s.Unmatched, "clock_offset_ns", s.OffsetNs, "timer_step_ns", s.TimerStepNs)
		}
		return err
	})
	return recs, err
}

// lastReplay runs around the traced replay (traceRuns): before it, after
// the warm replays are done, and after it is done.
type lastReplay struct {
	before, after func() error
	lost          int // records the buffer had no room for
}

// clockRecords is the block clocks' buffer, in records: a DeepSeek-V3.2
// dims step of 9 MoE layers has ~30k blocks; the MTP and 4-slot steps more.
const clockRecords = 1 << 20

// blockClockHooks arms the block clocks for the traced replay only (the warm
// replays would fill the buffer) and reads them into *out after it; done
// disarms them and frees the buffer, on every path.
func (cb *cudaDevice) blockClockHooks(out *[]kernels.BlockClock) (h *lastReplay, done func() error) {
	var buf cuda.DevPtr
	var shares []kernels.ClockShare
	h = &lastReplay{}
	h.before = func() error {
		var err error
		if buf, err = cb.c.Alloc(int64(clockRecords * kernels.BlockClockWords * 8)); err != nil {
			return errors.Wrap(err, "timeline: the block clocks' buffer")
		}
		shares, err = cb.k.ArmBlockClocks(buf, clockRecords)
		return err
	}
	h.after = func() error {
		var err error
		*out, h.lost, err = cb.k.ReadBlockClocks(shares)
		return err
	}
	done = func() error {
		if buf == 0 {
			return nil
		}
		_, err := cb.k.ArmBlockClocks(0, 0)
		return errors.CombineErrors(err, cb.c.Free(buf))
	}
	return h, done
}

// clockMatch says how attachBlockClocks went.
type clockMatch struct {
	Records   int
	Launches  int // kernel records
	Matched   int // launches given block times
	Unmatched []string
	// OffsetNs is the median of (CUPTI start - first block entry) over the
	// matched launches, added to every block time; TimerStepNs the
	// smallest step seen between two block entries (the timer's
	// resolution, if blocks are dense enough).
	OffsetNs    int64
	TimerStepNs int64
}

// attachBlockClocks gives each kernel record (sorted by start) its blocks'
// times. The records of one kernel name and grid size, sorted by entry,
// are cut into runs of the grid's size, the i-th run the i-th launch of
// that name and size; a run whose block indexes are not each block once
// (launches of one kernel and grid overlapping, or records lost) leaves
// that kernel's launches without block times.
func attachBlockClocks(recs []cupti.KernelRecord, cl []kernels.BlockClock) clockMatch {
	type key struct{ h, n uint32 }
	m := clockMatch{Records: len(cl), Launches: len(recs)}
	byKey := map[key][]kernels.BlockClock{}
	type blockAt struct{ n, b, sm uint32 }
	marks := map[blockAt][]kernels.BlockClock{}
	for _, c := range cl {
		if c.NameHash == kernels.MarksTag {
			at := blockAt{c.Blocks, c.Block, c.SM}
			marks[at] = append(marks[at], c)
			continue
		}
		k := key{c.NameHash, c.Blocks}
		byKey[k] = append(byKey[k], c)
	}
	// marksOf is the marks record of block c: the one of its grid size,
	// index and SM whose first mark taken falls between its entry and exit.
	marksOf := func(c kernels.BlockClock) *[kernels.MarksMax]uint64 {
		rs := marks[blockAt{c.Blocks, c.Block, c.SM}]
		for i := range rs {
			if j := slices.IndexFunc(rs[i].Marks[:], func(t uint64) bool { return t != 0 }); j >= 0 {
				if t := rs[i].Marks[j]; t >= c.Entry && t <= c.Exit {
					return &rs[i].Marks
				}
			}
		}
		return nil
	}
	launches := map[key][]int{}
	var order []key
	for i, r := range recs {
		n := uint32(max(r.Grid[0], 1) * max(r.Grid[1], 1) * max(r.Grid[2], 1))
		k := key{kernels.NameHash(r.Name), n}
		if _, ok := launches[k]; !ok {
			order = append(order, k)
		}
		launches[k] = append(launches[k], i)
	}
	times := map[int]*cupti.BlockTimes{}
	var offs []int64
	for _, k := range order {
		idx, cs := launches[k], byKey[k]
		if len(cs) != len(idx)*int(k.n) || !kernels.SplitRuns(cs, int(k.n)) {
			m.Unmatched = append(m.Unmatched, fmt.Sprintf("%s x%d (%d blocks recorded for %d launches)", recs[idx[0]].Name, k.n, len(cs), len(idx)))
			continue
		}
		labels := kernels.MarkLabels(recs[idx[0]].Name)
		for j, i := range idx {
			bt := blockTimes(cs[j*int(k.n):(j+1)*int(k.n)], labels, marksOf)
			times[i] = bt
			offs = append(offs, int64(recs[i].Start)-bt.FirstIn)
		}
	}
	if len(offs) > 0 {
		slices.Sort(offs)
		m.OffsetNs = offs[(len(offs)-1)/2]
	}
	for i, bt := range times {
		recs[i].Blocks = bt.Shift(-m.OffsetNs)
		m.Matched++
	}
	entries := make([]int64, 0, len(cl))
	for _, c := range cl {
		entries = append(entries, int64(c.Entry))
	}
	slices.Sort(entries)
	for i := 1; i < len(entries); i++ {
		if d := entries[i] - entries[i-1]; d > 0 && (m.TimerStepNs == 0 || d < m.TimerStepNs) {
			m.TimerStepNs = d
		}
	}
	return m
}

// blockTimes sums up one launch's blocks; where the kernel takes marks
// (labels), each mark's median time from release over the blocks with one
// (marksOf: a block's marks record, nil none).
func blockTimes(cs []kernels.BlockClock, labels []string, marksOf func(kernels.BlockClock) *[kernels.MarksMax]uint64) *cupti.BlockTimes {
	bt := &cupti.BlockTimes{Blocks: len(cs), FirstIn: math.MaxInt64, FirstReleased: math.MaxInt64, FirstOut: math.MaxInt64}
	sms := map[uint32]bool{}
	runs := make([]int64, 0, len(cs))
	for _, c := range cs {
		in, rel, out := int64(c.Entry), int64(c.Released), int64(c.Exit)
		bt.FirstIn, bt.LastIn = min(bt.FirstIn, in), max(bt.LastIn, in)
		bt.FirstReleased, bt.LastReleased = min(bt.FirstReleased, rel), max(bt.LastReleased, rel)
		bt.FirstOut, bt.LastOut = min(bt.FirstOut, out), max(bt.LastOut, out)
		sms[c.SM] = true
		runs = append(runs, out-rel)
	}
	slices.Sort(runs)
	bt.SMs = len(sms)
	bt.RunP50Ns = runs[(len(runs)-1)/2]
	var at [kernels.MarksMax][]int64 // each mark's times from release
	blockMarks := func(c kernels.BlockClock) []cupti.MarkAt {
		if labels == nil || marksOf == nil {
			return nil
		}
		ms := marksOf(c)
		if ms == nil {
			return nil
		}
		var out []cupti.MarkAt
		for i, t := range ms {
			if t == 0 || i >= len(labels) || labels[i] == "" {
				continue
			}
			d := int64(t) - int64(c.Released)
			at[i] = append(at[i], d)
			out = append(out, cupti.MarkAt{Label: labels[i], Ns: d})
		}
		return out
	}
	each := len(cs) <= cupti.EachMax
	for _, c := range cs {
		ms := blockMarks(c)
		if each {
			bt.Each = append(bt.Each, cupti.BlockRun{Block: int(c.Block), SM: int(c.SM), In: int64(c.Entry), Released: int64(c.Released), Out: int64(c.Exit), Marks: ms})
		}
	}
	if each {
		slices.SortFunc(bt.Each, func(a, b cupti.BlockRun) int { return a.Block - b.Block })
	}
	for i, ds := range at {
		if len(ds) == 0 {
			continue
		}
		slices.Sort(ds)
		bt.Marks = append(bt.Marks, cupti.MarkStat{Label: labels[i], Blocks: len(ds), P50Ns: ds[(len(ds)-1)/2]})
	}
	return bt
}

// traceRuns captures each run as a graph with the tracer on (CUPTI then
// sees the graphs made: graphs instantiated before CUPTI first attached
// are the case its users report trouble with), replays them all warm
// times, waits, and replays them once more. Every replay runs the same
// kernels, so the records are warm+1 equal shares and the last share by
// start time (after the wait) is the traced step's; a count that does not
// split evenly is an error (records lost or foreign). The tracer is
// stopped on every path.
func traceRuns(tr kernelTracer, gr grapher, b device, runs [][]gop, warm int, sync func() error, last *lastReplay) ([]cupti.KernelRecord, error) {
	if len(runs) == 0 {
		return nil, errors.New("timeline: the step queued no device work")
	}
	if err := tr.Start(); err != nil {
		return nil, err
	}
	var xs []graphExec
	reps := max(warm, 1) + 1
	err := func() error {
		for _, run := range runs {
			x, err := captureOps(gr, b, run)
			if err != nil {
				return errors.Wrap(err, "timeline: capturing the step's runs")
			}
			xs = append(xs, x)
		}
		launchAll := func() error {
			for _, x := range xs {
				if err := gr.launch(x); err != nil {
					return err
				}
			}
			return nil
		}
		for range reps - 1 {
			if err := launchAll(); err != nil {
				return err
			}
		}
		// The wait puts the traced replay after every warm kernel.
		if err := sync(); err != nil {
			return err
		}
		if last != nil {
			if err := last.before(); err != nil {
				return err
			}
		}
		if err := launchAll(); err != nil {
			return err
		}
		if err := sync(); err != nil || last == nil {
			return err
		}
		return last.after()
	}()
	recs, serr := tr.Stop()
	for _, x := range xs {
		err = errors.CombineErrors(err, gr.destroy(x))
	}
	if err = errors.CombineErrors(err, serr); err != nil {
		return nil, err
	}
	if len(recs) == 0 || len(recs)%reps != 0 {
		return nil, errors.WithHint(errors.Newf("timeline: CUPTI recorded %d kernels over %d replays of the same graphs: not the same number each", len(recs), reps),
			"check that no other profiler (nsys, ncu) holds CUPTI and that nothing else runs on the GPU")
	}
	sort.SliceStable(recs, func(i, j int) bool { return recs[i].Start < recs[j].Start })
	return recs[len(recs)-len(recs)/reps:], nil
}
