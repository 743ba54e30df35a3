// Package metrics is the roles' Prometheus instrumentation: counters and
// histograms with labels and gauges read at scrape time, registered on a
// per-server registry and exposed in the text format. It is a thin,
// typed layer over prometheus/client_golang (registration, concurrency,
// exposition and escaping are the library's), kept so that every server
// declares its series the same way.
package metrics

import (
	"io"
	"sort"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
)

// Registry holds one server's metric families.
type Registry struct {
	r *prometheus.Registry
}

// NewRegistry returns an empty registry (no process or Go runtime series:
// a server exports what it declares).
func NewRegistry() *Registry { return &Registry{r: prometheus.NewRegistry()} }

// Prometheus is the underlying registry (to add the library's collectors).
func (r *Registry) Prometheus() *prometheus.Registry { return r.r }

// ContentType is the exposition's HTTP content type.
const ContentType = "text/plain; version=0.0.4; charset=utf-8"

// Write renders every family in the text format (families sorted by name,
// series by label values).
func (r *Registry) Write(w io.Writer) error {
	mfs, err := r.r.Gather()
	if err != nil {
		return err
	}
	enc := expfmt.NewEncoder(w, expfmt.NewFormat(expfmt.TypeTextPlain))
	for _, mf := range mfs {
		if err := enc.Encode(mf); err != nil {
			return err
		}
	}
	return nil
}

// Counter is a monotonically increasing value.
type Counter struct{ prometheus.Counter }

// Value returns the current value.
func (c *Counter) Value() float64 {
	var m dto.Metric
	_ = c.Write(&m)
	return m.GetCounter().GetValue()
}

// CounterVec is a counter family with labels.
type CounterVec struct{ v *prometheus.CounterVec }

// NewCounter registers a counter family. With no labels, use With().
func (r *Registry) NewCounter(name, help string, labels ...string) *CounterVec {
	c := &CounterVec{v: prometheus.NewCounterVec(prometheus.CounterOpts{Name: name, Help: help}, labels)}
	r.r.MustRegister(c.v)
	if len(labels) == 0 {
		c.Init() // an unlabelled counter shows 0 from the start
	}
	return c
}

// With returns the counter for the label values (in registration order).
func (c *CounterVec) With(vals ...string) *Counter { return &Counter{c.v.WithLabelValues(vals...)} }

// Init creates the series for vals so they export 0 before the first event.
func (c *CounterVec) Init(vals ...string) { c.v.WithLabelValues(vals...) }

// NewGauge registers a gauge whose value f returns at each scrape.
func (r *Registry) NewGauge(name, help string, f func() float64) {
	r.r.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: name, Help: help}, f))
}

// Histogram counts observations into cumulative buckets.
type Histogram struct{ prometheus.Observer }

// Count returns the number of observations.
func (h *Histogram) Count() uint64 {
	var m dto.Metric
	if w, ok := h.Observer.(prometheus.Metric); ok {
		_ = w.Write(&m)
	}
	return m.GetHistogram().GetSampleCount()
}

// HistogramVec is a histogram family with labels.
type HistogramVec struct{ v *prometheus.HistogramVec }

// NewHistogram registers a histogram family with the given bucket upper
// bounds (sorted ascending; +Inf is implied).
func (r *Registry) NewHistogram(name, help string, buckets []float64, labels ...string) *HistogramVec {
	if !sort.Float64sAreSorted(buckets) {
		panic("metrics: " + name + ": buckets not sorted")
	}
	h := &HistogramVec{v: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: name, Help: help, Buckets: buckets}, labels)}
	r.r.MustRegister(h.v)
	if len(labels) == 0 {
		h.v.WithLabelValues()
	}
	return h
}

// With returns the histogram for the label values.
func (h *HistogramVec) With(vals ...string) *Histogram {
	return &Histogram{h.v.WithLabelValues(vals...)}
}

// ExpBuckets returns n bucket bounds start, start*factor, ...
func ExpBuckets(start, factor float64, n int) []float64 {
	return prometheus.ExponentialBuckets(start, factor, n)
}
