package benchcmd

import (
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/urfave/cli/v2"

	"github.com/tilert-go/tilert/cuda/cupti"
)

func TestTimelineRefusals(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--dummy-weights", "deepseek-v3.2", "--timeline", "x.json"}, "needs --context"},
		{[]string{"--context", "1024", "--device", "cpu", "--model-dir", "m", "--timeline", "x.json"}, "--device cpu"},
		{[]string{"--dummy-weights", "deepseek-v3.2", "--context", "1024", "--profile", "--timeline", "x.json"}, "--profile"},
		{[]string{"--dummy-weights", "deepseek-v3.2", "--context", "1024", "--devices", "0,1", "--timeline", "x.json"}, "unsharded"},
	} {
		dir := t.TempDir()
		for i, a := range tc.args {
			if a == "x.json" {
				tc.args[i] = filepath.Join(dir, a)
			}
		}
		app := &cli.App{Commands: []*cli.Command{Command()}, Writer: io.Discard, ErrWriter: io.Discard, ExitErrHandler: func(*cli.Context, error) {}}
		err := app.Run(append([]string{"tilert", "bench", "decode"}, tc.args...))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: err = %v, want one containing %q", tc.args, err, tc.want)
		}
		if ents, _ := os.ReadDir(dir); len(ents) != 0 {
			t.Errorf("%v: left %d files behind", tc.args, len(ents))
		}
	}
}

func TestTraceAfter(t *testing.T) {
	for _, tc := range []struct {
		ntok int
		mtp  bool
		want int
	}{{64, false, 61}, {5, false, 2}, {64, true, 30}, {5, true, 1}, {6, true, 1}} {
		got := traceAfter(tc.ntok, tc.mtp)
		if got != tc.want {
			t.Errorf("traceAfter(%d, %v) = %d, want %d", tc.ntok, tc.mtp, got, tc.want)
		}
		// A slot (first token from Start, at most 2 a step with MTP) must
		// still have a token left for the traced step.
		per := 1
		if tc.mtp {
			per = 2
		}
		if 1+per*got+per > tc.ntok {
			t.Errorf("traceAfter(%d, %v) = %d: the traced step can run past the slots' tokens", tc.ntok, tc.mtp, got)
		}
	}
}

// twoLayers: embed, then per layer norm, a GEMV and an attention on a
// side stream beside it, then the sampler.
func twoLayers() []cupti.KernelRecord {
	k := func(name string, stream uint32, start, end uint64) cupti.KernelRecord {
		return cupti.KernelRecord{Name: name, Stream: stream, Start: start, End: end, GraphID: 1, GraphNodeID: start}
	}
	return []cupti.KernelRecord{
		k("embed", 1, 0, 2000),
		k("norm", 1, 2500, 3000), k("gemv", 1, 3000, 8000), k("attn", 2, 3000, 6000),
		k("norm", 1, 9000, 9500), k("gemv", 1, 9500, 14500), k("attn", 2, 9500, 12500),
		k("sample", 1, 15000, 16000),
	}
}

func TestAnalyseRowReport(t *testing.T) {
	row, err := analyseRow(twoLayers(), 8192, 4, 2)
	if err != nil {
		t.Fatal(err)
	}
	// norm, gemv and attn each run once per layer: norm starts first.
	if row.LayerMark != "norm" || len(row.Analysis.Layers) != 2 {
		t.Fatalf("layer mark %q, %d layers", row.LayerMark, len(row.Analysis.Layers))
	}
	if one, _ := analyseRow(twoLayers(), 8192, 4, 1); one.LayerMark != "" {
		t.Errorf("one layer: mark %q", one.LayerMark)
	}
	// One main layer and an MTP one: two of each layer's kernels.
	if mtp, _ := analyseRow(twoLayers(), 8192, 4, 1, 2); mtp.LayerMark != "norm" {
		t.Errorf("1 + MTP layers: mark %q, want norm", mtp.LayerMark)
	}
	var b strings.Builder
	reportTimeline(&b, row)
	out := b.String()
	for _, want := range []string{
		"8 kernels, span 16.0 us, busy 14.0 us (88%), idle 2.0 us in 3 gaps",
		"at most 2 at once, streams [1 2]",
		"gemv                                        2 runs      10.0 us",
		"idle    0.50 us at +2.0 us: after embed, before norm",
		"2 layers (each from norm): mean 6.8 us, busy 6.0 us; 2.5 us before the first", // the last runs to the span end
		// Charged: attn 3+3, gemv 2+2 (from attn's end), embed 2, norm and
		// sample 1; the three idle gaps are left.
		"time charged at completion by name (the span split at kernel ends, to the kernel ending; 2.0 us uncharged):",
		"attn                                        2 runs       6.0 us (mean    3.00)  37.5% of span",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("summary lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "as it ran") {
		t.Errorf("two layers have no middle one to show:\n%s", out)
	}
}

// TestReportMedianLayer: three layers, each a norm, a GEMV launched early
// (PDL) that waits for it, and an attention on a side stream; the middle
// layer is printed in end order.
func TestReportMedianLayer(t *testing.T) {
	k := func(name string, stream uint32, start, end uint64) cupti.KernelRecord {
		return cupti.KernelRecord{Name: name, Stream: stream, Start: start, End: end, Grid: [3]int32{132, 1, 1}}
	}
	recs := []cupti.KernelRecord{
		k("embed", 1, 0, 2000),
		k("norm", 1, 2000, 3000), k("gemv", 1, 2100, 6000), k("attn", 2, 3000, 5000),
		k("norm", 1, 6000, 7000), k("gemv", 1, 6100, 10000), k("attn", 2, 7000, 9000),
		k("norm", 1, 11000, 12000), k("gemv", 1, 11100, 14000), k("attn", 2, 12000, 13000),
		k("sample", 1, 14000, 15000),
	}
	out := reportThree(t, recs)
	for _, want := range []string{
		"layer 1 of 0-2 as it ran (median span of the 1 between the first and the last): 5.0 us; in end order, us from its start:",
		"\n         0.0      1.0      1.0      1.0      1 132x1x1        norm\n" +
			"         1.0      3.0      2.0      2.0      2 132x1x1        attn\n" +
			"         0.1      4.0      3.9      1.0      1 132x1x1        gemv\n",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("summary lacks %q:\n%s", want, out)
		}
	}
}

// TestTimelineFiles re-analyses the rows of real --timeline files (a glob
// in TILERT_TIMELINE_FILES; skipped without) and logs the summaries, to
// read them with -v after a change to the analysis.
func TestTimelineFiles(t *testing.T) {
	paths, _ := filepath.Glob(os.Getenv("TILERT_TIMELINE_FILES"))
	if len(paths) == 0 {
		t.Skip("set TILERT_TIMELINE_FILES to a glob of bench --timeline files")
	}
	for _, p := range paths {
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		var f TimelineFile
		if err := json.Unmarshal(b, &f); err != nil {
			t.Fatalf("%s: %v", p, err)
		}
		for _, r := range f.Rows {
			// As many layers as the recorded mark ran.
			nl := 0
			for _, k := range r.Kernels {
				if k.Name == r.LayerMark {
					nl++
				}
			}
			row, err := analyseRow(r.Kernels, r.Context, r.Slots, nl)
			if err != nil {
				t.Fatalf("%s: %v", p, err)
			}
			a := row.Analysis
			var sum uint64
			for _, n := range a.Charged {
				sum += n.TotalNs
			}
			if row.LayerMark != r.LayerMark || sum+a.UnchargedNs != a.SpanNs || a.SpanNs != r.Analysis.SpanNs {
				t.Errorf("%s context %d slots %d: mark %q (file %q), charged %d + %d of span %d (file %d)",
					p, r.Context, r.Slots, row.LayerMark, r.LayerMark, sum, a.UnchargedNs, a.SpanNs, r.Analysis.SpanNs)
			}
			var out strings.Builder
			reportTimeline(&out, row)
			t.Logf("%s (%s) context %d, %d slots:\n%s", filepath.Base(p), f.Model, r.Context, r.Slots, out.String())
		}
	}
}

func TestWriteTimeline(t *testing.T) {
	dir := t.TempDir()
	row, err := analyseRow(twoLayers(), 1024, 1, 2)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "step.json")
	if err := writeTimeline(path, TimelineFile{Model: "m", Rows: []TimelineRow{row}}); err != nil {
		t.Fatal(err)
	}
	var back TimelineFile
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, &back); err != nil {
		t.Fatal(err)
	}
	if len(back.Rows) != 1 || back.Rows[0].Context != 1024 || len(back.Rows[0].Kernels) != 8 || back.Rows[0].Analysis.BusyNs != 14000 {
		t.Errorf("read back %+v", back)
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 1 {
		t.Errorf("%d files in the folder, want only step.json", len(ents))
	}
	if err := writeTimeline(filepath.Join(dir, "none", "step.json"), back); err == nil {
		t.Error("writing into a missing folder: want an error")
	}
}

// Without libcupti, --timeline stops before the model loads and writes
// nothing.
func TestTimelineNoLibrary(t *testing.T) {
	if _, err := cupti.Open(); err == nil {
		t.Skip("libcupti is here: the refusal cannot be seen")
	}
	path := filepath.Join(t.TempDir(), "step.json")
	app := &cli.App{Commands: []*cli.Command{Command()}, Writer: io.Discard, ErrWriter: io.Discard, ExitErrHandler: func(*cli.Context, error) {}}
	err := app.Run([]string{"tilert", "bench", "decode", "--dummy-weights", "deepseek-v3.2", "--context", "1024", "--timeline", path})
	if err == nil || !strings.Contains(err.Error(), "libcupti not found") {
		t.Fatalf("err = %v, want libcupti not found", err)
	}
	if _, serr := os.Stat(path); serr == nil {
		t.Error("the timeline file was written")
	}
}

// With block clocks, the median layer's kernels list their blocks too,
// from the layer's start.
func TestReportMedianLayerBlocks(t *testing.T) {
	k := func(name string, start, end uint64, b *cupti.BlockTimes) cupti.KernelRecord {
		return cupti.KernelRecord{Name: name, Stream: 1, Start: start, End: end, Grid: [3]int32{132, 1, 1}, Blocks: b}
	}
	bt := func(at int64) *cupti.BlockTimes {
		return &cupti.BlockTimes{Blocks: 132, SMs: 132, FirstIn: at, LastIn: at + 500, FirstReleased: at + 1000, LastReleased: at + 1200,
			FirstOut: at + 2500, LastOut: at + 3000, RunP50Ns: 1500,
			Each: []cupti.BlockRun{{Block: 0, SM: 3, In: at, Released: at + 1000, Out: at + 2500,
				Marks: []cupti.MarkAt{{Label: "keys in", Ns: 400}, {Label: "stored", Ns: 1400}}}},
			Marks: []cupti.MarkStat{{Label: "keys in", Blocks: 132, P50Ns: 450}, {Label: "stored", Blocks: 132, P50Ns: 1350}}}
	}
	recs := []cupti.KernelRecord{
		k("norm", 0, 1000, nil), k("gemv", 100, 4000, bt(100)),
		k("norm", 5000, 6000, nil), k("gemv", 5100, 9000, bt(5100)),
		k("norm", 10000, 11000, nil), k("gemv", 10100, 14000, bt(10100)),
	}
	out := reportThree(t, recs)
	for _, want := range []string{
		"its blocks (block clocks), us from the layer's start",
		"\n         0.1      0.6      1.1      1.3      2.6      3.1      1.5   132    132 gemv\n",
		"\n        marks, us after release (the median block): keys in +0.5, stored +1.4\n",
		"\n        block 0 (SM 3): in 0.1, released 1.1, out 2.6, ran 1.5; marks keys in +0.4, stored +1.4\n",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("summary lacks %q:\n%s", want, out)
		}
	}
	if _, blocks, _ := strings.Cut(out, "its blocks"); strings.Contains(blocks, " norm") {
		t.Errorf("a kernel without clocks got a blocks row:\n%s", out)
	}
}

// reportThree analyses recs as a three-layer step at 8192, 1 slot, and
// returns its report.
func reportThree(t *testing.T, recs []cupti.KernelRecord) string {
	t.Helper()
	row, err := analyseRow(recs, 8192, 1, 3)
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	reportTimeline(&b, row)
	return b.String()
}
