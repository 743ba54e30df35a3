// Package metrics is a small Prometheus text-format (version 0.0.4)
// exposition: counters and histograms with labels, and gauges read at scrape
// time. It avoids client_golang's dependency tree for the handful of series
// the tilert roles export.
package metrics

import (
	"bufio"
	"fmt"
	"io"
	"math"
	"sort"
	"strconv"
	"strings"
	"sync"
)

// Registry holds metric families in registration order.
type Registry struct {
	mu       sync.Mutex
	families []family
	names    map[string]bool
}

type family interface {
	name() string
	write(w *bufio.Writer)
}

// NewRegistry returns an empty registry.
func NewRegistry() *Registry { return &Registry{names: map[string]bool{}} }

func (r *Registry) add(f family) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.names[f.name()] {
		panic("metrics: " + f.name() + " registered twice")
	}
	r.names[f.name()] = true
	r.families = append(r.families, f)
}

// ContentType is the exposition's HTTP content type.
const ContentType = "text/plain; version=0.0.4; charset=utf-8"

// Write renders every family in the text format.
func (r *Registry) Write(w io.Writer) error {
	r.mu.Lock()
	fs := append([]family(nil), r.families...)
	r.mu.Unlock()
	bw := bufio.NewWriter(w)
	for _, f := range fs {
		f.write(bw)
	}
	return bw.Flush()
}

func header(w *bufio.Writer, name, help, typ string) {
	fmt.Fprintf(w, "# HELP %s %s\n# TYPE %s %s\n", name, escapeHelp(help), name, typ)
}

func escapeHelp(s string) string {
	return strings.NewReplacer(`\`, `\\`, "\n", `\n`).Replace(s)
}

func escapeLabel(s string) string {
	return strings.NewReplacer(`\`, `\\`, "\n", `\n`, `"`, `\"`).Replace(s)
}

func formatFloat(v float64) string {
	switch {
	case math.IsInf(v, 1):
		return "+Inf"
	case math.IsInf(v, -1):
		return "-Inf"
	case math.IsNaN(v):
		return "NaN"
	}
	return strconv.FormatFloat(v, 'g', -1, 64)
}

// labelString renders {k="v",...}; extra is appended (the histogram's le).
func labelString(keys, vals []string, extraKey, extraVal string) string {
	if len(keys) == 0 && extraKey == "" {
		return ""
	}
	var b strings.Builder
	b.WriteByte('{')
	for i, k := range keys {
		if i > 0 {
			b.WriteByte(',')
		}
		fmt.Fprintf(&b, `%s="%s"`, k, escapeLabel(vals[i]))
	}
	if extraKey != "" {
		if len(keys) > 0 {
			b.WriteByte(',')
		}
		fmt.Fprintf(&b, `%s="%s"`, extraKey, escapeLabel(extraVal))
	}
	b.WriteByte('}')
	return b.String()
}

// series is one label combination of a vector.
type series[T any] struct {
	vals []string
	m    T
}

type vec[T any] struct {
	mu     sync.Mutex
	keys   []string
	series map[string]*series[T]
	mk     func() T
}

func (v *vec[T]) with(vals []string) T {
	if len(vals) != len(v.keys) {
		panic(fmt.Sprintf("metrics: %d label values for labels %v", len(vals), v.keys))
	}
	k := strings.Join(vals, "\xff")
	v.mu.Lock()
	defer v.mu.Unlock()
	s, ok := v.series[k]
	if !ok {
		s = &series[T]{vals: append([]string(nil), vals...), m: v.mk()}
		v.series[k] = s
	}
	return s.m
}

// sorted returns the series ordered by label values, for stable output.
func (v *vec[T]) sorted() []*series[T] {
	v.mu.Lock()
	out := make([]*series[T], 0, len(v.series))
	for _, s := range v.series {
		out = append(out, s)
	}
	v.mu.Unlock()
	sort.Slice(out, func(i, j int) bool { return strings.Join(out[i].vals, "\xff") < strings.Join(out[j].vals, "\xff") })
	return out
}

// Counter is a monotonically increasing value.
type Counter struct {
	mu sync.Mutex
	v  float64
}

// Add adds d (>= 0).
func (c *Counter) Add(d float64) {
	if d < 0 {
		panic("metrics: counter decreased")
	}
	c.mu.Lock()
	c.v += d
	c.mu.Unlock()
}

// Inc adds one.
func (c *Counter) Inc() { c.Add(1) }

// Value returns the current value.
func (c *Counter) Value() float64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.v
}

// CounterVec is a counter family with labels.
type CounterVec struct {
	n, help string
	vec[*Counter]
}

// NewCounter registers a counter family. With no labels, use With().
func (r *Registry) NewCounter(name, help string, labels ...string) *CounterVec {
	c := &CounterVec{n: name, help: help, vec: vec[*Counter]{keys: labels, series: map[string]*series[*Counter]{}, mk: func() *Counter { return &Counter{} }}}
	if len(labels) == 0 {
		c.with(nil) // an unlabelled counter shows 0 from the start
	}
	r.add(c)
	return c
}

// With returns the counter for the label values (in registration order).
func (c *CounterVec) With(vals ...string) *Counter { return c.with(vals) }

// Init creates the series for vals so they export 0 before the first event.
func (c *CounterVec) Init(vals ...string) { c.with(vals) }

func (c *CounterVec) name() string { return c.n }

func (c *CounterVec) write(w *bufio.Writer) {
	header(w, c.n, c.help, "counter")
	for _, s := range c.sorted() {
		fmt.Fprintf(w, "%s%s %s\n", c.n, labelString(c.keys, s.vals, "", ""), formatFloat(s.m.Value()))
	}
}

// gauge is read at scrape time.
type gauge struct {
	n, help string
	f       func() float64
}

// NewGauge registers a gauge whose value f returns at each scrape.
func (r *Registry) NewGauge(name, help string, f func() float64) {
	r.add(&gauge{n: name, help: help, f: f})
}

func (g *gauge) name() string { return g.n }

func (g *gauge) write(w *bufio.Writer) {
	header(w, g.n, g.help, "gauge")
	fmt.Fprintf(w, "%s %s\n", g.n, formatFloat(g.f()))
}

// Histogram counts observations into cumulative buckets.
type Histogram struct {
	mu     sync.Mutex
	upper  []float64
	counts []uint64 // per bucket, not cumulative; the last is +Inf
	sum    float64
	n      uint64
}

// Observe records v.
func (h *Histogram) Observe(v float64) {
	i := sort.SearchFloat64s(h.upper, v) // first bucket with upper >= v
	h.mu.Lock()
	h.counts[i]++
	h.sum += v
	h.n++
	h.mu.Unlock()
}

// Count returns the number of observations.
func (h *Histogram) Count() uint64 {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.n
}

// HistogramVec is a histogram family with labels.
type HistogramVec struct {
	n, help string
	vec[*Histogram]
}

// NewHistogram registers a histogram family with the given bucket upper
// bounds (sorted ascending; +Inf is implied).
func (r *Registry) NewHistogram(name, help string, buckets []float64, labels ...string) *HistogramVec {
	if !sort.Float64sAreSorted(buckets) {
		panic("metrics: " + name + ": buckets not sorted")
	}
	up := append([]float64(nil), buckets...)
	h := &HistogramVec{n: name, help: help, vec: vec[*Histogram]{keys: labels, series: map[string]*series[*Histogram]{},
		mk: func() *Histogram { return &Histogram{upper: up, counts: make([]uint64, len(up)+1)} }}}
	if len(labels) == 0 {
		h.with(nil)
	}
	r.add(h)
	return h
}

// With returns the histogram for the label values.
func (h *HistogramVec) With(vals ...string) *Histogram { return h.with(vals) }

func (h *HistogramVec) name() string { return h.n }

func (h *HistogramVec) write(w *bufio.Writer) {
	header(w, h.n, h.help, "histogram")
	for _, s := range h.sorted() {
		hg := s.m
		hg.mu.Lock()
		var cum uint64
		for i, up := range hg.upper {
			cum += hg.counts[i]
			fmt.Fprintf(w, "%s_bucket%s %d\n", h.n, labelString(h.keys, s.vals, "le", formatFloat(up)), cum)
		}
		cum += hg.counts[len(hg.upper)]
		fmt.Fprintf(w, "%s_bucket%s %d\n", h.n, labelString(h.keys, s.vals, "le", "+Inf"), cum)
		fmt.Fprintf(w, "%s_sum%s %s\n", h.n, labelString(h.keys, s.vals, "", ""), formatFloat(hg.sum))
		fmt.Fprintf(w, "%s_count%s %d\n", h.n, labelString(h.keys, s.vals, "", ""), hg.n)
		hg.mu.Unlock()
	}
}

// ExpBuckets returns n bucket bounds start, start*factor, ...
func ExpBuckets(start, factor float64, n int) []float64 {
	out := make([]float64, n)
	for i := range out {
		out[i] = start
		start *= factor
	}
	return out
}
