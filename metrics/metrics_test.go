package metrics

import (
	"bytes"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

var update = flag.Bool("update", false, "rewrite testdata golden files")

func TestExposition(t *testing.T) {
	r := NewRegistry()
	reqs := r.NewCounter("t_requests_total", "Requests by outcome.", "outcome")
	reqs.Init("error")
	reqs.With("stop").Add(2)
	reqs.With("length").Inc()
	toks := r.NewCounter("t_tokens_total", "Tokens.\nSecond line with \\ backslash.")
	toks.With().Add(41)
	r.NewGauge("t_busy", "Busy slots.", func() float64 { return 3 })
	h := r.NewHistogram("t_step_seconds", "Step time.", []float64{0.001, 0.01, 0.1})
	for _, v := range []float64{0.0005, 0.001, 0.005, 0.05, 2} {
		h.With().Observe(v)
	}
	lab := r.NewCounter("t_rejects_total", "Rejects.", "where", "reason")
	lab.With("http", `we"ird\`).Inc()

	var buf bytes.Buffer
	if err := r.Write(&buf); err != nil {
		t.Fatal(err)
	}
	golden := filepath.Join("testdata", "exposition.txt")
	if *update {
		if err := os.WriteFile(golden, buf.Bytes(), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(golden)
	if err != nil {
		t.Fatalf("%v (run with -update to create it)", err)
	}
	if buf.String() != string(want) {
		t.Fatalf("exposition differs from %s:\n%s", golden, buf.String())
	}
}

func TestHistogramBuckets(t *testing.T) {
	cases := []struct {
		name string
		obs  []float64
		want []uint64 // cumulative per bucket, +Inf last
	}{
		{"empty", nil, []uint64{0, 0, 0}},
		{"on bounds", []float64{1, 2}, []uint64{1, 2, 2}},
		{"above", []float64{5, 0.5}, []uint64{1, 1, 2}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r := NewRegistry()
			h := r.NewHistogram("h", "h", []float64{1, 2}).With()
			for _, v := range c.obs {
				h.Observe(v)
			}
			var m dto.Metric
			if err := h.Observer.(prometheus.Metric).Write(&m); err != nil {
				t.Fatal(err)
			}
			var got []uint64
			for _, b := range m.GetHistogram().GetBucket() {
				got = append(got, b.GetCumulativeCount())
			}
			got = append(got, m.GetHistogram().GetSampleCount()) // +Inf
			for i := range c.want {
				if got[i] != c.want[i] {
					t.Fatalf("bucket %d: %d, want %d", i, got[i], c.want[i])
				}
			}
			if h.Count() != uint64(len(c.obs)) {
				t.Fatalf("count %d", h.Count())
			}
		})
	}
}

func TestConcurrentAndMisuse(t *testing.T) {
	r := NewRegistry()
	c := r.NewCounter("c_total", "c", "k")
	var wg sync.WaitGroup
	for i := 0; i < 8; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := 0; j < 1000; j++ {
				c.With("a").Inc()
			}
		}()
	}
	wg.Wait()
	if v := c.With("a").Value(); v != 8000 {
		t.Fatalf("counter %v, want 8000", v)
	}
	for name, f := range map[string]func(){
		"duplicate":   func() { r.NewCounter("c_total", "again") },
		"label count": func() { c.With("a", "b") },
		"decrease":    func() { c.With("a").Add(-1) },
		"unsorted":    func() { r.NewHistogram("h2", "h", []float64{2, 1}) },
	} {
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("%s: no panic", name)
				}
			}()
			f()
		}()
	}
	var b strings.Builder
	_ = r.Write(&b)
	if !strings.Contains(b.String(), `c_total{k="a"} 8000`) {
		t.Fatalf("output:\n%s", b.String())
	}
}

func BenchmarkCounterInc(b *testing.B) {
	b.ReportAllocs()
	c := NewRegistry().NewCounter("c", "c").With()
	for i := 0; i < b.N; i++ {
		c.Inc()
	}
}
