package benchcmd

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
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
