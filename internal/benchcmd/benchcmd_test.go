package benchcmd

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/urfave/cli/v2"
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
