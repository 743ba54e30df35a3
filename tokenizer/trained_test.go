package tokenizer

import (
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"testing"
)

// trainedModels are the checkpoints scripts/train_tiny.py trained; their
// tokenizer.json files were trained with HF tokenizers on the KJV text.
var trainedModels = []string{"deepseek-v3.2-tiny-kjv", "glm-5-tiny-kjv"}

// trainedTexts: KJV text, digits, odd spacing, non-ASCII and the families'
// special tokens; the held-out chapters are appended.
var trainedTexts = []string{
	"And God said, Let there be light: and there was light.",
	"The LORD is my shepherd; I shall not want.",
	"Then answered Jesus and said unto them, Verily, verily, I say unto you, The Son can do nothing of himself,\n\nbut what he seeth the Father do.",
	"In the 600th year of Noah's life, in the 2nd month, the 17th day of the month...",
	"  two spaces, a tab\there, 'quotes' and \"double\" -- dashes; 1234567 digits; café naïve 日本語",
	"<|user|>\nHello<|assistant|>\n<think></think>",
	"<｜begin▁of▁sentence｜><｜User｜>Who art thou?<｜Assistant｜>",
}

type trainedCase struct {
	Text string `json:"text"`
	IDs  []int  `json:"ids"`
}

// TestTrainedTokenizers: the trained tokenizers (testdata/models/*/
// tokenizer.json) encode exactly as HF tokenizers does
// (testdata/trained_ids.json; regenerate with go test ./tokenizer -run
// TrainedTokenizers -update) and decode back to the text.
func TestTrainedTokenizers(t *testing.T) {
	golden := filepath.Join("testdata", "trained_ids.json")
	held, err := os.ReadFile(filepath.Join("..", "testdata", "models", "kjv-heldout.txt"))
	if err != nil {
		t.Fatal(err)
	}
	texts := append(slices.Clone(trainedTexts), string(held))
	if *update {
		if !hasHF() {
			t.Fatalf("-update needs the HF tokenizers library at %s (set TILERT_PYTHON)", pythonPath())
		}
		toks := map[string][]byte{}
		for _, m := range trainedModels {
			b, err := os.ReadFile(filepath.Join("..", "testdata", "models", m, "tokenizer.json"))
			if err != nil {
				t.Fatal(err)
			}
			toks[m] = b
		}
		o := runHF(t, toks, texts)
		out := map[string][]trainedCase{}
		for _, m := range trainedModels {
			for i, text := range texts {
				out[m] = append(out[m], trainedCase{Text: text, IDs: o.Results[m].IDs[i]})
			}
		}
		b, _ := json.MarshalIndent(out, "", "")
		if err := os.WriteFile(golden, append(b, '\n'), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	data, err := os.ReadFile(golden)
	if err != nil {
		t.Fatal(err)
	}
	var want map[string][]trainedCase
	if err := json.Unmarshal(data, &want); err != nil {
		t.Fatal(err)
	}
	for _, model := range trainedModels {
		t.Run(model, func(t *testing.T) {
			cases := want[model]
			if len(cases) != len(texts) {
				t.Fatalf("%d cases in %s, want %d (regenerate with -update)", len(cases), golden, len(texts))
			}
			tok, err := Load(filepath.Join("..", "testdata", "models", model))
			if err != nil {
				t.Fatal(err)
			}
			if tok.VocabSize() != 2048 {
				t.Errorf("vocabulary %d, want 2048", tok.VocabSize())
			}
			for i, c := range cases {
				if c.Text != texts[i] {
					t.Fatalf("case %d of %s is another text (regenerate with -update)", i, golden)
				}
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
