package tokenizer

import (
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"testing"
)

// TestTrainedTokenizers: the byte-level BPE tokenizers that
// scripts/train_tiny.py trained with HF tokenizers on the KJV text
// (testdata/models/*/tokenizer.json) encode exactly as HF does
// (testdata/trained_ids.json, written with tokenizers 0.23 by the snippet in
// scripts/README.md) and decode back to the text.
func TestTrainedTokenizers(t *testing.T) {
	data, err := os.ReadFile(filepath.Join("testdata", "trained_ids.json"))
	if err != nil {
		t.Fatal(err)
	}
	var want map[string][]struct {
		Text string `json:"text"`
		IDs  []int  `json:"ids"`
	}
	if err := json.Unmarshal(data, &want); err != nil {
		t.Fatal(err)
	}
	if len(want) != 2 {
		t.Fatalf("%d models in trained_ids.json, want 2", len(want))
	}
	for model, cases := range want {
		t.Run(model, func(t *testing.T) {
			tok, err := Load(filepath.Join("..", "testdata", "models", model))
			if err != nil {
				t.Fatal(err)
			}
			if tok.VocabSize() != 2048 {
				t.Errorf("vocabulary %d, want 2048", tok.VocabSize())
			}
			for i, c := range cases {
				got, err := tok.Encode(c.Text, false)
				if err != nil {
					t.Fatal(err)
				}
				if !slices.Equal(got, c.IDs) {
					n := min(len(got), len(c.IDs), 40)
					t.Errorf("case %d: %d ids, HF %d; first ids %v, HF %v", i, len(got), len(c.IDs), got[:n], c.IDs[:n])
				}
				if back := tok.Decode(c.IDs, false); back != c.Text {
					t.Errorf("case %d: decode gives %q, want %q", i, back[:min(len(back), 80)], c.Text[:min(len(c.Text), 80)])
				}
			}
		})
	}
}
