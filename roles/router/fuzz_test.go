package router

import (
	"encoding/json"
	"math"
	"testing"

	"github.com/tilert-go/tilert/tokenizer"
)

// FuzzChatBody feeds arbitrary /v1/chat/completions and /v1/completions
// bodies to the router's request checks and, for the bodies it takes, to
// the builders of the prefill and /pd/decode requests: never a panic; a
// refusal is a 4xx with a message; what is taken is within vLLM's ranges.
//
//	go test ./roles/router -run '^$' -fuzz FuzzChatBody -fuzztime 60s
func FuzzChatBody(f *testing.F) {
	for _, s := range []string{
		`{"model":"glm-5-tiny","messages":[{"role":"user","content":"Hello"}],"max_tokens":8,"temperature":0.7,"top_p":0.9,"top_k":40,"seed":3,"stream":true,"stream_options":{"include_usage":true}}`,
		`{"model":"glm-5-tiny","prompt":"The decode engine","max_tokens":16,"stop":["\n"],"logprobs":2}`,
		`{"prompt":[1,2,3],"max_tokens":1000000000,"ignore_eos":true}`,
		`{"messages":[{"role":"user","content":[{"type":"text","text":"x"}]}],"temperature":1e308}`,
		`{"messages":[],"tools":[{"type":"function","function":{"name":"f","parameters":{}}}],"tool_choice":"auto"}`,
		`{"prompt":"x","n":2}`, `{"prompt":"x","logit_bias":{"5":100}}`, `{"prompt":"x","stop_token_ids":[-1]}`,
		`{"prompt":"x","min_p":0.1,"bad_words":["a"," b"],"thinking_token_budget":4,"repetition_detection":{"max_pattern_size":3,"min_count":2}}`,
		`{"messages":[{"role":"user","content":"x"}],"prompt_logprobs":2,"return_prompt_text":true,"return_token_ids":true,"include_reasoning":false}`,
		`{"prompt":"x","use_beam_search":true,"structured_outputs":{"regex":"a"}}`,
		`[]`, `null`, `{"prompt":"x"}{"prompt":"y"}`, `{"model":7}`,
	} {
		f.Add([]byte(s), true)
		f.Add([]byte(s), false)
	}
	tok, err := tokenizer.Load(tinyModel(f))
	if err != nil {
		f.Fatal(err)
	}
	n := &node{host: "127.0.0.1", ctrlPort: 5556, slots: 4, up: true}
	rt := &Router{tok: tok, served: "glm-5-tiny", names: map[string]bool{"glm-5-tiny": true}, vllm: "http://127.0.0.1:1",
		vllmModel: "vllm-name", keepIDs: map[int]bool{}, gate: newGate([]*node{n}, 0)}
	f.Fuzz(func(t *testing.T, body []byte, chat bool) {
		req, e := rt.check(body, chat)
		if e != nil {
			if e.Status < 400 || e.Status >= 500 || e.Message == "" {
				t.Fatalf("refusal %+v", e)
			}
			return
		}
		if req.spillReason != "" {
			return // the pool does not take it (spilled or 400 by the caller)
		}
		if math.IsNaN(req.temperature) || math.IsInf(req.temperature, 0) || req.temperature < 0 ||
			!(req.topP > 0 && req.topP <= 1) || req.topK < -1 || req.MaxTokens < 0 {
			t.Fatalf("taken with temperature %v top_p %v top_k %d max_tokens %d", req.temperature, req.topP, req.topK, req.MaxTokens)
		}
		pb, err := req.prefillBody("vllm-name", n, "tilert-00")
		if err != nil {
			t.Fatalf("prefill body: %v", err)
		}
		// Unknown fields pass through to vLLM verbatim (numbers past
		// float64 included), so only the router's own fields are read.
		var m map[string]json.RawMessage
		if json.Unmarshal(pb, &m) != nil || string(m["max_tokens"]) != "1" || string(m["stream"]) != "false" {
			t.Fatalf("prefill body %s", pb)
		}
		d := req.decodeRequest("tilert-00", 1, []int{1, 2})
		if _, err := json.Marshal(d); err != nil {
			t.Fatalf("decode request: %v", err)
		}
	})
}
