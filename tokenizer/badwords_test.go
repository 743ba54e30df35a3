package tokenizer

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

const badWordsGolden = "testdata/bad_words_vllm.json"

// badWordsCases mix one- and many-id words, leading whitespace, punctuation,
// several words in one entry, and words whose spaced form vLLM keeps.
var badWordsCases = []string{"LORD", " begat", "Moses", "thee and thou", "  unto", "Jerusalem!", "é", "x", "Israel,", "\tsaid",
	"the", "and", "of", "said", "he", "unto", "And", "God", "shall be", "it"}

// badWordsScript runs vLLM's own SamplingParams.update_from_tokenizer on the
// model's tokenizer loaded by vLLM.
const badWordsScript = `
import json, sys
import vllm
from vllm.sampling_params import SamplingParams
from vllm.tokenizers.registry import get_tokenizer
req = json.load(sys.stdin)
tok = get_tokenizer(req["dir"])
out = []
for w in req["words"]:
    sp = SamplingParams(bad_words=[w])
    sp.update_from_tokenizer(tok)
    out.append(sp._bad_words_token_ids)
json.dump({"vllm": vllm.__version__, "words": req["words"], "ids": out}, sys.stdout)
`

// The token id sequences of bad words are vLLM's (golden written by vLLM
// 0.33.0's own code on the committed tiny model's tokenizer; refresh with
// TILERT_PYTHON=<a python with vllm> go test ./tokenizer -run BadWords -update).
func TestBadWordsMatchVLLM(t *testing.T) {
	dir := filepath.Join("..", "testdata", "models", "glm-5-tiny-kjv")
	if *update {
		py := pythonPath()
		in, _ := json.Marshal(map[string]any{"dir": dir, "words": badWordsCases})
		cmd := exec.Command(py, "-c", badWordsScript)
		cmd.Stdin = strings.NewReader(string(in))
		cmd.Stderr = os.Stderr
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("-update needs vLLM at %s (set TILERT_PYTHON): %v", py, err)
		}
		if err := os.WriteFile(badWordsGolden, append(out, '\n'), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	b, err := os.ReadFile(badWordsGolden)
	if err != nil {
		t.Fatal(err)
	}
	var g struct {
		VLLM  string    `json:"vllm"`
		Words []string  `json:"words"`
		IDs   [][][]int `json:"ids"`
	}
	if err := json.Unmarshal(b, &g); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(g.Words, badWordsCases) {
		t.Fatalf("the golden's words %q are not the test's; run -update", g.Words)
	}
	tok, err := Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	spaced := 0
	for i, w := range g.Words {
		got, err := tok.BadWords([]string{w}, 128)
		if err != nil {
			t.Fatalf("%q: %v", w, err)
		}
		if !reflect.DeepEqual(got, g.IDs[i]) {
			t.Errorf("%q: %v, vLLM %s: %v", w, got, g.VLLM, g.IDs[i])
		}
		if len(got) == 2 {
			spaced++
		}
	}
	if spaced == 0 {
		t.Errorf("no word kept its spaced form: the cases do not reach that rule")
	}
	// Whitespace alone encodes to nothing; too many sequences are refused.
	if _, err := tok.BadWords([]string{"x", "  "}, 128); err == nil {
		t.Errorf("a whitespace-only bad word was accepted")
	}
	if _, err := tok.BadWords(badWordsCases, 3); err == nil || !strings.Contains(err.Error(), "the max number is 3") {
		t.Errorf("the limit: %v", err)
	}
}
