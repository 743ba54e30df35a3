package cupti

import (
	"encoding/json"
	"flag"
	"os"
	"path/filepath"
	"reflect"
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
	// Charged by hand, in end order (frontier after): embed 100 (1100),
	// norm 50 (1150), gemv_kv 100 from its start (1300; 1150-1200 was idle
	// or gemv_q alone), gemv_q 100 (1400), attn 250 (1700; 50 idle), norm
	// 40 (1740), gemv_kv 90 (1900; 60 idle, 10 gemv_q alone), gemv_q 100,
	// sample 20: 850 of the 1020 span.
	wantCharged := []NameStat{
		{Name: "attn", Count: 1, TotalNs: 250, MeanNs: 250}, {Name: "gemv_q", Count: 2, TotalNs: 200, MeanNs: 100},
		{Name: "gemv_kv", Count: 2, TotalNs: 190, MeanNs: 95}, {Name: "embed", Count: 1, TotalNs: 100, MeanNs: 100},
		{Name: "norm", Count: 2, TotalNs: 90, MeanNs: 45}, {Name: "sample", Count: 1, TotalNs: 20, MeanNs: 20},
	}
	checkCharged(t, tl, wantCharged, 170)
	if tl.MedianLayer != nil {
		t.Errorf("two layers: median layer %+v, want none (the first and last are left out)", tl.MedianLayer)
	}
	golden(t, "timeline.golden.json", tl)
}

// pdlRecords: a head, five layers opened by "a", each with a "b" launched
// early (PDL) that waits for a's end, and a tail. Layer 3 also has "c" on
// a side stream and "d" after b. Layer spans: 30 30 50 40 40.
func pdlRecords() []KernelRecord {
	k := func(name string, stream uint32, start, end uint64) KernelRecord {
		return KernelRecord{Name: name, Stream: stream, Start: start, End: end, Grid: [3]int32{int32(end - start), 1, 1}}
	}
	return []KernelRecord{
		k("head", 1, 0, 10),
		k("a", 1, 10, 20), k("b", 1, 12, 40),
		k("a", 1, 40, 50), k("b", 1, 41, 70),
		k("a", 1, 70, 100), k("b", 1, 72, 120),
		k("a", 1, 120, 130), k("b", 1, 121, 150), k("c", 2, 125, 140), k("d", 1, 150, 160),
		k("a", 1, 160, 170), k("b", 1, 161, 180),
		k("tail", 1, 180, 200),
	}
}

func TestAnalyzeCharged(t *testing.T) {
	tl, err := Analyze(pdlRecords(), Options{LayerMark: "a"})
	if err != nil {
		t.Fatal(err)
	}
	// b runs 153 ns start to end but works only from each a's end: 20 20
	// 20 10 10. The charges cover the whole span (nothing starts past the
	// frontier).
	if n := tl.Names[0]; n.Name != "b" || n.TotalNs != 153 {
		t.Errorf("top name by duration %+v, want b 153 ns", n)
	}
	wantCharged := []NameStat{
		{Name: "b", Count: 5, TotalNs: 80, MeanNs: 16}, {Name: "a", Count: 5, TotalNs: 70, MeanNs: 14},
		{Name: "tail", Count: 1, TotalNs: 20, MeanNs: 20}, {Name: "c", Count: 1, TotalNs: 10, MeanNs: 10},
		{Name: "d", Count: 1, TotalNs: 10, MeanNs: 10}, {Name: "head", Count: 1, TotalNs: 10, MeanNs: 10},
	}
	checkCharged(t, tl, wantCharged, 0)
	// Of layers 1-3 (spans 30 50 40) the median is layer 3; c, on the
	// side stream, ends before b.
	want := LayerRun{Index: 3, AtNs: 120, SpanNs: 40, Kernels: []LayerKernel{
		{Name: "a", StartNs: 0, EndNs: 10, Ns: 10, ChargedNs: 10, Stream: 1, Grid: [3]int32{10, 1, 1}},
		{Name: "c", StartNs: 5, EndNs: 20, Ns: 15, ChargedNs: 10, Stream: 2, Grid: [3]int32{15, 1, 1}},
		{Name: "b", StartNs: 1, EndNs: 30, Ns: 29, ChargedNs: 10, Stream: 1, Grid: [3]int32{29, 1, 1}},
		{Name: "d", StartNs: 30, EndNs: 40, Ns: 10, ChargedNs: 10, Stream: 1, Grid: [3]int32{10, 1, 1}},
	}}
	if m := tl.MedianLayer; m == nil || !reflect.DeepEqual(*m, want) {
		t.Errorf("median layer %+v, want %+v", m, want)
	}
	golden(t, "timeline_pdl.golden.json", tl)
}

// checkCharged compares tl.Charged, less the shares (checked as total over
// span), and the uncharged rest.
func checkCharged(t *testing.T, tl *Timeline, want []NameStat, uncharged uint64) {
	t.Helper()
	var sum uint64
	got := make([]NameStat, len(tl.Charged))
	for i, n := range tl.Charged {
		if n.Share != float64(n.TotalNs)/float64(tl.SpanNs) {
			t.Errorf("%s: share %v of span %d", n.Name, n.Share, tl.SpanNs)
		}
		n.Share = 0
		got[i] = n
		sum += n.TotalNs
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("charged %+v, want %+v", got, want)
	}
	if tl.UnchargedNs != uncharged || sum+tl.UnchargedNs != tl.SpanNs {
		t.Errorf("uncharged %d (charged %d, span %d), want %d", tl.UnchargedNs, sum, tl.SpanNs, uncharged)
	}
}

func TestMedianLayer(t *testing.T) {
	for _, tc := range []struct {
		spans []uint64
		want  int // -1: none
	}{
		{[]uint64{10, 30, 20, 40, 15}, 1}, // middles 30 20 40
		{[]uint64{10, 30, 20, 40}, 2},     // middles 30 20: the shorter
		{[]uint64{10, 25, 25, 25, 10}, 2}, // equal spans keep layer order
		{[]uint64{50, 20, 50}, 1},
		{[]uint64{10, 20}, -1},
		{[]uint64{10}, -1},
	} {
		// One "m" per layer, lasting its layer (the last one sets the end).
		var recs []KernelRecord
		var at uint64 = 100
		for _, s := range tc.spans {
			recs = append(recs, KernelRecord{Name: "m", Start: at, End: at + s})
			at += s
		}
		tl, err := Analyze(recs, Options{LayerMark: "m"})
		if err != nil {
			t.Fatal(err)
		}
		switch m := tl.MedianLayer; {
		case tc.want < 0 && m != nil:
			t.Errorf("spans %v: median layer %d, want none", tc.spans, m.Index)
		case tc.want >= 0 && (m == nil || m.Index != tc.want || m.SpanNs != tc.spans[tc.want] || len(m.Kernels) != 1):
			t.Errorf("spans %v: median layer %+v, want layer %d", tc.spans, m, tc.want)
		}
	}
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
	// b ends first and is charged 10; a then only 80 (from b's end): the
	// 10 ns a ran alone before b started is left uncharged.
	if nested.Charged[0].Name != "a" || nested.Charged[0].TotalNs != 80 || nested.UnchargedNs != 10 {
		t.Errorf("nested: charged %+v, uncharged %d", nested.Charged, nested.UnchargedNs)
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
