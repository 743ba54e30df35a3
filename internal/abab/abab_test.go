package main

import (
	"bytes"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

var update = flag.Bool("update", false, "rewrite golden files under testdata/")

func TestVerdict(t *testing.T) {
	for _, c := range []struct {
		name   string
		a, b   [2]float64
		d1, d2 float64
		want   string
	}{
		{"faster twice", [2]float64{2.610, 2.612}, [2]float64{2.590, 2.591}, -20, -21, "wins twice"},
		{"slower twice", [2]float64{2.615, 2.617}, [2]float64{2.628, 2.631}, 13, 14, "loses"},
		{"one faster one slower", [2]float64{2.600, 2.600}, [2]float64{2.590, 2.610}, -10, 10, "within spread"},
		// Faster twice, but by less than the default's own spread (10 us).
		{"within the default's spread", [2]float64{2.600, 2.610}, [2]float64{2.595, 2.605}, -5, -5, "within spread"},
		// Faster twice by less than the variant's own spread (8 us).
		{"within the variant's spread", [2]float64{2.600, 2.600}, [2]float64{2.595, 2.587}, -5, -13, "within spread"},
		// The bench prints ms to 3 decimals: 1 us is the floor of the spread.
		{"one microsecond", [2]float64{2.600, 2.600}, [2]float64{2.599, 2.599}, -1, -1, "within spread"},
		{"two microseconds", [2]float64{2.600, 2.600}, [2]float64{2.598, 2.598}, -2, -2, "wins twice"},
	} {
		d1, d2, v := verdict(pair{a: c.a, b: c.b})
		if v != c.want || !near(d1, c.d1) || !near(d2, c.d2) {
			t.Errorf("%s: verdict(%v, %v) = %+.1f, %+.1f, %q; want %+.1f, %+.1f, %q", c.name, c.a, c.b, d1, d2, v, c.d1, c.d2, c.want)
		}
	}
}

func near(a, b float64) bool { return abs(a-b) < 1e-6 }

func TestParseAndPairs(t *testing.T) {
	in := `kernels: 3 PASS, 0 FAIL, 0 SKIP; rc=0
x-A      8192     1     2.610     2.639     383.1      7.891     1.881     3023    72%      261.0
x-B TILERT_GPU_A=1 TILERT_GPU_B=q=1     8192     1     2.600     2.797     360.9      7.891     1.862     2848    67%      277.1
x-A2      8192     1     2.613     2.633     382.7      7.891     1.871     3020    72%      261.3
x-B2 TILERT_GPU_A=1 TILERT_GPU_B=q=1     8192     1     2.700     2.791     360.4      7.891     1.862     2844    67%      277.5
x-B2 TILERT_GPU_A=1 TILERT_GPU_B=q=1     8192     1     2.601     2.791     360.4      7.891     1.862     2844    67%      277.5
tl-x TILERT_GPU_A=1     8192     1     2.601     2.791     360.4      7.891     1.862     2844    67%      277.5
y-A    131072     4     5.632     5.758     710.2     16.317     3.874     2897    69%      469.3
y-B Z=1    131072     4     5.532     5.758     710.2     16.317     3.874     2897    69%      469.3
`
	rows, err := parse(strings.NewReader(in), 0)
	if err != nil {
		t.Fatal(err)
	}
	if len(rows) != 8 {
		t.Fatalf("%d rows, want 8: %+v", len(rows), rows)
	}
	if r := rows[1]; r.name != "x-B" || r.env != "TILERT_GPU_A=1 TILERT_GPU_B=q=1" || r.ctx != 8192 || r.slots != 1 || r.p50 != 2.600 {
		t.Errorf("row 1 = %+v", r)
	}
	ps, partial := pairs(rows)
	if len(ps) != 1 || len(partial) != 1 || partial[0] != "y" {
		t.Fatalf("pairs = %+v, incomplete %v; want x complete, y incomplete", ps, partial)
	}
	// The later x-B2 replaces the earlier one.
	if p := ps[0]; p.base != "x" || p.b != [2]float64{2.600, 2.601} || p.a != [2]float64{2.610, 2.613} || p.env != "TILERT_GPU_A=1 TILERT_GPU_B=q=1" {
		t.Errorf("pair = %+v", p)
	}
}

// TestReportGolden: session 34 call A's summary as the report prints it
// (testdata/s34.golden; -update rewrites it).
func TestReportGolden(t *testing.T) {
	f, err := os.Open(filepath.Join("..", "..", "docs", "measured", "h200-2026-12-05-s34", "callA", "summary.txt"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	rows, err := parse(f, 0)
	if err != nil {
		t.Fatal(err)
	}
	var b bytes.Buffer
	ps, partial := pairs(rows)
	report(&b, ps, partial)
	golden := filepath.Join("testdata", "s34.golden")
	if *update {
		if err := os.WriteFile(golden, b.Bytes(), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(golden)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(b.Bytes(), want) {
		t.Errorf("report differs from %s (go test ./internal/abab -update rewrites it):\n%s", golden, b.String())
	}
}
