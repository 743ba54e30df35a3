package cupti

import (
	"slices"
	"sort"

	"github.com/cockroachdb/errors"
)

// Timeline is what one traced step's kernels say about the step as the
// GPU ran it. Times are ns; offsets are from the first kernel's start.
type Timeline struct {
	Kernels int `json:"kernels"`
	// SpanNs runs from the first start to the last end; BusyNs is the
	// time at least one kernel ran (the union of the kernels' intervals),
	// IdleNs the rest. SumNs adds every kernel's duration: above BusyNs by
	// what ran concurrently (side streams, graph branches).
	SpanNs uint64 `json:"span_ns"`
	BusyNs uint64 `json:"busy_ns"`
	IdleNs uint64 `json:"idle_ns"`
	SumNs  uint64 `json:"sum_ns"`
	// MaxConcurrent is the most kernels running at one instant.
	MaxConcurrent int      `json:"max_concurrent"`
	Streams       []uint32 `json:"streams"`
	// Gaps are the longest idle gaps, longest first; IdleGaps counts all.
	Gaps     []Gap      `json:"gaps"`
	IdleGaps int        `json:"idle_gaps"`
	Names    []NameStat `json:"names"`
	// Charged is the span split at kernel completions, by name (see
	// charge): unlike Names it does not count the time a kernel launched
	// early (PDL) spends waiting on the one before. UnchargedNs is the rest
	// of the span: idle time, and time only a kernel ending later ran.
	Charged     []NameStat `json:"charged"`
	UnchargedNs uint64     `json:"uncharged_ns"`
	Order       []Entry    `json:"order"`
	// Layers: with a layer mark, one per run of kernels starting at a
	// kernel of that name; LeadNs is the time before the first.
	Layers []Layer `json:"layers,omitempty"`
	LeadNs uint64  `json:"lead_ns,omitempty"`
	// MedianLayer is the layer of median span among all but the first and
	// the last (which carry the step's head and tail), as it ran; with
	// fewer than three layers there is none.
	MedianLayer *LayerRun `json:"median_layer,omitempty"`
}

// Gap is a time when no kernel ran: from AtNs, NS long, between the last
// kernel to end before it and the first to start after it.
type Gap struct {
	AtNs   uint64 `json:"at_ns"`
	Ns     uint64 `json:"ns"`
	Before string `json:"before"`
	After  string `json:"after"`
}

// NameStat is every run of one kernel name.
type NameStat struct {
	Name    string  `json:"name"`
	Count   int     `json:"count"`
	TotalNs uint64  `json:"total_ns"`
	MeanNs  float64 `json:"mean_ns"`
	// Share is TotalNs over the step's span.
	Share float64 `json:"share_of_span"`
}

// Entry is one kernel in start order.
type Entry struct {
	Name        string `json:"name"`
	AtNs        uint64 `json:"at_ns"`
	Ns          uint64 `json:"ns"`
	Stream      uint32 `json:"stream"`
	GraphNodeID uint64 `json:"graph_node_id"`
}

// Layer is the kernels from one layer mark to the next (the last: to the
// span's end).
type Layer struct {
	AtNs    uint64 `json:"at_ns"`
	SpanNs  uint64 `json:"span_ns"`
	BusyNs  uint64 `json:"busy_ns"`
	Kernels int    `json:"kernels"`
}

// LayerRun is one layer's kernels in the order they completed.
type LayerRun struct {
	// Index counts the layers from 0.
	Index   int           `json:"index"`
	AtNs    uint64        `json:"at_ns"`
	SpanNs  uint64        `json:"span_ns"`
	Kernels []LayerKernel `json:"kernels"`
}

// LayerKernel is one kernel of a LayerRun. StartNs and EndNs are from the
// layer's start; ChargedNs is its share of the step's span (see charge).
type LayerKernel struct {
	Name      string   `json:"name"`
	StartNs   uint64   `json:"start_ns"`
	EndNs     uint64   `json:"end_ns"`
	Ns        uint64   `json:"ns"`
	ChargedNs uint64   `json:"charged_ns"`
	Stream    uint32   `json:"stream"`
	Grid      [3]int32 `json:"grid"`
	// Blocks: its block clocks, from the layer's start (nil: none).
	Blocks *BlockTimes `json:"blocks,omitempty"`
}

// Options shape an analysis.
type Options struct {
	// Gaps is how many of the longest idle gaps to keep (0: 5).
	Gaps int
	// LayerMark, when set, names the kernel that opens each layer (e.g.
	// the layer's first one); the layers are cut at its starts.
	LayerMark string
}

// Analyze summarises the kernel records of one step.
func Analyze(recs []KernelRecord, o Options) (*Timeline, error) {
	if len(recs) == 0 {
		return nil, errors.New("cupti: no kernel records to analyse")
	}
	if o.Gaps <= 0 {
		o.Gaps = 5
	}
	rs := slices.Clone(recs)
	sort.SliceStable(rs, func(i, j int) bool {
		if rs[i].Start != rs[j].Start {
			return rs[i].Start < rs[j].Start
		}
		return rs[i].End < rs[j].End
	})
	t0 := rs[0].Start
	tl := &Timeline{Kernels: len(rs)}
	durs := make([]uint64, len(rs))
	streams := map[uint32]bool{}
	var gaps []Gap
	var end uint64 // the latest end so far
	last := 0      // the kernel that ends at end
	for i, r := range rs {
		if r.End < r.Start {
			return nil, errors.Newf("cupti: kernel %s ends before it starts", r.Name)
		}
		d := r.End - r.Start
		durs[i] = d
		tl.SumNs += d
		streams[r.Stream] = true
		tl.Order = append(tl.Order, Entry{Name: r.Name, AtNs: r.Start - t0, Ns: d, Stream: r.Stream, GraphNodeID: r.GraphNodeID})
		switch {
		case i == 0:
			tl.BusyNs, end, last = d, r.End, 0
		case r.Start > end:
			gaps = append(gaps, Gap{AtNs: end - t0, Ns: r.Start - end, Before: rs[last].Name, After: r.Name})
			tl.BusyNs += d
			end, last = r.End, i
		case r.End > end:
			tl.BusyNs += r.End - end
			end, last = r.End, i
		}
	}
	tl.SpanNs = end - t0
	tl.IdleNs = tl.SpanNs - tl.BusyNs
	tl.MaxConcurrent = maxConcurrent(rs)
	for s := range streams {
		tl.Streams = append(tl.Streams, s)
	}
	slices.Sort(tl.Streams)
	tl.IdleGaps = len(gaps)
	sort.SliceStable(gaps, func(i, j int) bool { return gaps[i].Ns > gaps[j].Ns })
	tl.Gaps = gaps[:min(len(gaps), o.Gaps)]
	tl.Names = byName(rs, durs, tl.SpanNs)
	charged := charge(rs)
	tl.Charged = byName(rs, charged, tl.SpanNs)
	var sum uint64
	for _, c := range charged {
		sum += c
	}
	tl.UnchargedNs = tl.SpanNs - sum
	if o.LayerMark != "" {
		var cuts []int
		tl.Layers, tl.LeadNs, cuts = layers(rs, o.LayerMark, end)
		tl.MedianLayer = medianLayer(rs, charged, tl.Layers, cuts)
	}
	return tl, nil
}

// charge splits the span at kernel completions: walking rs in end order
// with a frontier f (at first the first start), each kernel is charged the
// part of its interval past f, max(0, end - max(f, start)), and f moves to
// its end. A kernel launched early (PDL) that waits for the one before is
// so charged only from that one's end: its work, not its wait. The result
// is indexed as rs (sorted by start); it sums to the span less the time
// before a kernel's start past f (idle, or only a later-ending kernel ran).
func charge(rs []KernelRecord) []uint64 {
	byEnd := make([]int, len(rs))
	for i := range byEnd {
		byEnd[i] = i
	}
	// Stable: kernels ending together keep start order, the first charged.
	sort.SliceStable(byEnd, func(a, b int) bool { return rs[byEnd[a]].End < rs[byEnd[b]].End })
	out := make([]uint64, len(rs))
	f := rs[0].Start
	for _, i := range byEnd {
		r := rs[i]
		if from := max(f, r.Start); r.End > from {
			out[i] = r.End - from
		}
		f = max(f, r.End)
	}
	return out
}

// byName adds ns (one value per kernel of rs: its duration, or its charge)
// up by kernel name, largest total first.
func byName(rs []KernelRecord, ns []uint64, span uint64) []NameStat {
	idx := map[string]int{}
	var out []NameStat
	for i, r := range rs {
		j, ok := idx[r.Name]
		if !ok {
			j = len(out)
			idx[r.Name] = j
			out = append(out, NameStat{Name: r.Name})
		}
		out[j].Count++
		out[j].TotalNs += ns[i]
	}
	for i := range out {
		n := &out[i]
		n.MeanNs = float64(n.TotalNs) / float64(n.Count)
		if span > 0 {
			n.Share = float64(n.TotalNs) / float64(span)
		}
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].TotalNs != out[j].TotalNs {
			return out[i].TotalNs > out[j].TotalNs
		}
		return out[i].Name < out[j].Name
	})
	return out
}

// medianLayer picks, of the layers but the first and the last, the one of
// median span (of an even count the shorter middle one; equal spans
// keep layer order), and lists its kernels (rs[cuts[i]:cuts[i+1]]) in end order.
func medianLayer(rs []KernelRecord, charged []uint64, ls []Layer, cuts []int) *LayerRun {
	if len(ls) < 3 {
		return nil
	}
	mid := make([]int, 0, len(ls)-2)
	for i := 1; i < len(ls)-1; i++ {
		mid = append(mid, i)
	}
	sort.SliceStable(mid, func(a, b int) bool { return ls[mid[a]].SpanNs < ls[mid[b]].SpanNs })
	li := mid[(len(mid)-1)/2]
	lo, hi := cuts[li], cuts[li+1]
	t := rs[lo].Start
	run := &LayerRun{Index: li, AtNs: ls[li].AtNs, SpanNs: ls[li].SpanNs}
	for i := lo; i < hi; i++ {
		r := rs[i]
		run.Kernels = append(run.Kernels, LayerKernel{Name: r.Name, StartNs: r.Start - t, EndNs: r.End - t, Ns: r.End - r.Start,
			ChargedNs: charged[i], Stream: r.Stream, Grid: r.Grid, Blocks: r.Blocks.Shift(int64(t))})
	}
	sort.SliceStable(run.Kernels, func(a, b int) bool { return run.Kernels[a].EndNs < run.Kernels[b].EndNs })
	return run
}

// maxConcurrent is the most intervals of rs (sorted by start) open at one
// instant; one ending exactly when another starts does not overlap it.
func maxConcurrent(rs []KernelRecord) int {
	ends := make([]uint64, 0, len(rs))
	best := 0
	for _, r := range rs {
		// Drop the kernels done by r's start.
		k := 0
		for _, e := range ends {
			if e > r.Start {
				ends[k] = e
				k++
			}
		}
		ends = append(ends[:k], r.End)
		best = max(best, len(ends))
	}
	return best
}

// layers cuts rs (sorted by start) at each start of a kernel named mark;
// cuts are the indexes in rs where the layers begin.
func layers(rs []KernelRecord, mark string, spanEnd uint64) (out []Layer, lead uint64, cuts []int) {
	for i, r := range rs {
		if r.Name == mark {
			cuts = append(cuts, i)
		}
	}
	if len(cuts) == 0 {
		return nil, 0, nil
	}
	t0 := rs[0].Start
	out = make([]Layer, len(cuts))
	for li, c := range cuts {
		hi := len(rs)
		stop := spanEnd
		if li+1 < len(cuts) {
			hi = cuts[li+1]
			stop = rs[hi].Start
		}
		seg := rs[c:hi]
		out[li] = Layer{AtNs: rs[c].Start - t0, SpanNs: stop - rs[c].Start, Kernels: len(seg), BusyNs: busyWithin(seg, rs[c].Start, stop)}
	}
	return out, rs[cuts[0]].Start - t0, cuts
}

// busyWithin is the union of seg's intervals (sorted by start) clipped to
// [lo, hi).
func busyWithin(seg []KernelRecord, lo, hi uint64) uint64 {
	var busy, end uint64
	end = lo
	for _, r := range seg {
		s, e := max(r.Start, end), min(r.End, hi)
		if e > s {
			busy += e - s
			end = e
		}
	}
	return busy
}
