package benchcmd

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/urfave/cli/v2"

	"github.com/tilert-go/tilert/engine/gpu"
)

func TestTextIDs(t *testing.T) {
	model := filepath.Join("..", "..", "testdata", "models", "glm-5-tiny-kjv")
	text := filepath.Join("..", "..", "testdata", "models", "kjv-heldout.txt")
	short := filepath.Join(t.TempDir(), "short.txt")
	if err := os.WriteFile(short, []byte("In the beginning"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, model, file string
		plen              int
		err               string
	}{
		{"text", model, text, 128, ""},
		{"too short", model, short, 128, "fewer than --prompt-len"},
		{"no tokenizer", t.TempDir(), text, 8, "tokenizer.json"},
		{"no file", model, filepath.Join(t.TempDir(), "none.txt"), 8, "reading --prompt-file"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ids, err := textIDs(tc.model, tc.file, tc.plen)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("err = %v, want one containing %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if len(ids) < tc.plen {
				t.Fatalf("%d ids", len(ids))
			}
		})
	}
}

// bench decode on the CPU: --prefill-lens times each length in the same
// engine; bad combinations are usage errors that say what to change.
func TestDecodePrefillLens(t *testing.T) {
	model := filepath.Join("..", "..", "testdata", "models", "glm-5-tiny-kjv")
	for _, tc := range []struct {
		name string
		args []string
		out  string
		err  string
	}{
		{"lens", []string{"--prompt-len", "24", "--tokens", "2", "--prefill-lens", "8,24"}, "prefill     24", ""},
		{"too long", []string{"--prompt-len", "16", "--tokens", "2", "--prefill-lens", "32"}, "", "longer than --prompt-len"},
		{"profile on cpu", []string{"--prompt-len", "8", "--tokens", "2", "--profile"}, "", "needs the GPU engine"},
		{"dummy and dir", []string{"--dummy-weights", "glm-5"}, "", "both given"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var out strings.Builder
			app := &cli.App{Name: "tilert", Writer: &out, ErrWriter: &out, Commands: []*cli.Command{Command()}, ExitErrHandler: func(*cli.Context, error) {}}
			args := append([]string{"tilert", "bench", "decode", "--device", "cpu", "--model-dir", model}, tc.args...)
			err := app.Run(args)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("err = %v, want one containing %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatalf("%+v", err)
			}
			if !strings.Contains(out.String(), tc.out) {
				t.Errorf("output lacks %q:\n%s", tc.out, out.String())
			}
		})
	}
}

// The GPU engine's --prefill-lens rows carry the device time of the same
// run: one line per length with the wall time, the device's busy time and
// span, and the differences (device idle at host waits, host outside).
func TestReportPrefillClock(t *testing.T) {
	var out strings.Builder
	report(&out, Result{
		PrefillMSByLen:    map[string]float64{"1024": 17.8, "8192": 145.45},
		PrefillClockByLen: map[string]gpu.PrefillClock{"8192": {WallMs: 145.4, SpanMs: 144.9, BusyMs: 130.5, Segments: 3}},
	})
	s := out.String()
	for _, want := range []string{
		"prefill   8192    145.45 ms (--prefill-lens)",
		"prefill   8192 wall 145.40 ms, device busy 130.50 ms in 3 runs between host waits, span 144.90 ms: device idle at host waits 14.40 ms, host outside the span 0.50 ms",
	} {
		if !strings.Contains(s, want) {
			t.Errorf("report lacks %q:\n%s", want, s)
		}
	}
	if strings.Contains(s, "prefill   1024 wall") {
		t.Errorf("a clock line for a length without a clock:\n%s", s)
	}
}
