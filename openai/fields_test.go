package openai

import (
	"encoding/json"
	"os"
	"reflect"
	"testing"
)

// fieldExamples sets each FieldOther field to a value vLLM accepts and that
// is not its default. A field added to vllmFields as FieldOther needs one.
var fieldExamples = map[string]string{
	"allowed_token_ids":      `[1, 2]`,
	"structured_outputs":     `{"json": {"type": "object"}}`,
	"use_beam_search":        `true`,
	"logprob_token_ids":      `[5]`,
	"watermarking":           `true`,
	"return_weight_versions": `true`,
	"vllm_xargs":             `{"k": 1}`,
	"prompt_embeds":          `"AAAA"`,
}

// Every FieldOther field set lands in Unmodelled, alone; set to its
// default (or null) it does not.
func TestUnmodelledFields(t *testing.T) {
	for _, chat := range []bool{false, true} {
		base := `"prompt":"hi"`
		if chat {
			base = `"messages":[{"role":"user","content":"hi"}]`
		}
		for _, name := range VLLMFieldNames(chat) {
			if use, _ := VLLMField(name, chat); use != FieldOther {
				continue
			}
			ex, ok := fieldExamples[name]
			if !ok {
				t.Fatalf("no example value for the FieldOther field %s", name)
			}
			r, e := ParseRequest([]byte(`{`+base+`,"`+name+`":`+ex+`}`), chat)
			if e != nil {
				t.Fatalf("chat=%v %s=%s refused by the parser: %v", chat, name, ex, e)
			}
			if len(r.Unmodelled) != 1 || r.Unmodelled[0].Param != name || r.Unmodelled[0].What == "" {
				t.Errorf("chat=%v %s=%s: unmodelled %+v", chat, name, ex, r.Unmodelled)
			}
			for _, def := range []string{"null", "false", "0", "[]", "{}", `""`} {
				r, e := ParseRequest([]byte(`{`+base+`,"`+name+`":`+def+`}`), chat)
				if e != nil || len(r.Unmodelled) != 0 {
					t.Errorf("chat=%v %s=%s (a default): %v %+v", chat, name, def, e, r.Unmodelled)
				}
			}
		}
	}
	r, _ := ParseRequest([]byte(`{"prompt":"hi","thinking_token_budget":-1,"user":"u","priority":3,"cache_salt":"s","not_a_vllm_field":1}`), false)
	if len(r.Unmodelled) != 0 {
		t.Errorf("unlimited thinking budget, no-effect, prompt and unknown fields: %+v", r.Unmodelled)
	}
	r, _ = ParseRequest([]byte(`{"prompt":"hi","use_beam_search":true,"allowed_token_ids":[3]}`), false)
	if got := []string{r.Unmodelled[0].Param, r.Unmodelled[1].Param}; !reflect.DeepEqual(got, []string{"allowed_token_ids", "use_beam_search"}) {
		t.Errorf("two fields: %v", got)
	}
}

// testdata/vllm-fields.json is vLLM 0.33.0's request fields per endpoint
// (python/tests/test_vllm_fields.py holds it to the installed vLLM's
// models, in `make test-vllm`); every one is classified here, and nothing
// is classified that vLLM does not accept.
func TestVLLMFieldsClassified(t *testing.T) {
	b, err := os.ReadFile("testdata/vllm-fields.json")
	if err != nil {
		t.Fatal(err)
	}
	var want struct {
		Version    string   `json:"vllm"`
		Chat       []string `json:"chat"`
		Completion []string `json:"completion"`
	}
	if err := json.Unmarshal(b, &want); err != nil {
		t.Fatal(err)
	}
	for _, ep := range []struct {
		chat  bool
		names []string
	}{{true, want.Chat}, {false, want.Completion}} {
		if got := VLLMFieldNames(ep.chat); !reflect.DeepEqual(got, ep.names) {
			t.Errorf("chat=%v: classified %v\nvLLM %s accepts %v", ep.chat, got, want.Version, ep.names)
		}
	}
}
