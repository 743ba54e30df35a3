package cupti

import (
	"encoding/json"
	"flag"
	"os"
	"path/filepath"
	"testing"
)

var update = flag.Bool("update", false, "rewrite testdata/*.golden.json")

// stepRecords is a small step on two streams: a side-stream GEMV beside
// each main one, three idle gaps (10, 50 and 60 ns), two layers opened by
// "norm". Given out of order, as buffers may hold them.
func stepRecords() []KernelRecord {
	k := func(name string, stream uint32, start, end uint64, node uint64) KernelRecord {
		return KernelRecord{Name: name, Stream: stream, Start: start, End: end, GraphID: 1, GraphNodeID: node,
			Correlation: 9, Grid: [3]int32{1, 1, 1}, Block: [3]int32{128, 1, 1}}
	}
	return []KernelRecord{
		k("gemv_q", 1, 1160, 1400, 3),
		k("embed", 1, 1000, 1100, 1),
		k("norm", 1, 1100, 1150, 2),
		k("gemv_kv", 2, 1200, 1300, 4),
		k("attn", 1, 1450, 1700, 5),
		k("norm", 1, 1700, 1740, 6),
		k("gemv_q", 1, 1800, 2000, 7),
		k("gemv_kv", 2, 1810, 1900, 8),
		k("sample", 1, 2000, 2020, 9),
	}
}

func TestAnalyze(t *testing.T) {
	tl, err := Analyze(stepRecords(), Options{Gaps: 2, LayerMark: "norm"})
	if err != nil {
		t.Fatal(err)
	}
	// Worked by hand: busy [1000,1150] [1160,1400] [1450,1740] [1800,2020].
	for _, c := range []struct {
		what      string
		got, want uint64
	}{
		{"span", tl.SpanNs, 1020}, {"busy", tl.BusyNs, 900}, {"idle", tl.IdleNs, 120}, {"sum", tl.SumNs, 1090},
		{"max concurrent", uint64(tl.MaxConcurrent), 2}, {"idle gaps", uint64(tl.IdleGaps), 3},
		{"lead", tl.LeadNs, 100},
	} {
		if c.got != c.want {
			t.Errorf("%s = %d, want %d", c.what, c.got, c.want)
		}
	}
	wantGaps := []Gap{{AtNs: 740, Ns: 60, Before: "norm", After: "gemv_q"}, {AtNs: 400, Ns: 50, Before: "gemv_q", After: "attn"}}
	if len(tl.Gaps) != 2 || tl.Gaps[0] != wantGaps[0] || tl.Gaps[1] != wantGaps[1] {
		t.Errorf("gaps %+v, want %+v", tl.Gaps, wantGaps)
	}
	if n := tl.Names[0]; n.Name != "gemv_q" || n.Count != 2 || n.TotalNs != 440 || n.MeanNs != 220 {
		t.Errorf("top name %+v, want gemv_q 2 runs 440 ns", n)
	}
	wantLayers := []Layer{{AtNs: 100, SpanNs: 600, BusyNs: 540, Kernels: 4}, {AtNs: 700, SpanNs: 320, BusyNs: 260, Kernels: 4}}
	if len(tl.Layers) != 2 || tl.Layers[0] != wantLayers[0] || tl.Layers[1] != wantLayers[1] {
		t.Errorf("layers %+v, want %+v", tl.Layers, wantLayers)
	}
	if len(tl.Streams) != 2 || tl.Order[0].Name != "embed" || tl.Order[len(tl.Order)-1].AtNs != 1000 {
		t.Errorf("streams %v, order %+v", tl.Streams, tl.Order)
	}
	golden(t, "timeline.golden.json", tl)
}

func TestAnalyzeEdges(t *testing.T) {
	if _, err := Analyze(nil, Options{}); err == nil {
		t.Error("no records: want an error")
	}
	one, err := Analyze([]KernelRecord{{Name: "k", Start: 5, End: 9}}, Options{LayerMark: "absent"})
	if err != nil {
		t.Fatal(err)
	}
	if one.SpanNs != 4 || one.BusyNs != 4 || one.IdleNs != 0 || len(one.Gaps) != 0 || one.Layers != nil || one.MaxConcurrent != 1 {
		t.Errorf("one kernel: %+v", one)
	}
	// A kernel nested inside another adds nothing to busy time.
	nested, err := Analyze([]KernelRecord{{Name: "a", Start: 0, End: 100}, {Name: "b", Start: 10, End: 20}, {Name: "c", Start: 100, End: 110}}, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if nested.BusyNs != 110 || nested.IdleGaps != 0 || nested.MaxConcurrent != 2 {
		t.Errorf("nested: busy %d gaps %d concurrent %d", nested.BusyNs, nested.IdleGaps, nested.MaxConcurrent)
	}
	if _, err := Analyze([]KernelRecord{{Name: "bad", Start: 9, End: 5}}, Options{}); err == nil {
		t.Error("end before start: want an error")
	}
}

// golden compares v as indented JSON with testdata/name (-update rewrites it).
func golden(t *testing.T, name string, v any) {
	t.Helper()
	got, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	got = append(got, '\n')
	path := filepath.Join("testdata", name)
	if *update {
		if err := os.WriteFile(path, got, 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run go test -run %s -update to write it)", err, t.Name())
	}
	if string(got) != string(want) {
		t.Errorf("%s differs from the analysis:\n%s", path, got)
	}
}
