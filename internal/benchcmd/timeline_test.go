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
	} {
		if !strings.Contains(out, want) {
			t.Errorf("summary lacks %q:\n%s", want, out)
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
