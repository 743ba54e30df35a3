package router

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/tilert-go/tilert/tokenizer"
)

// The router's side of the vLLM contract, checked against vLLM's own
// OpenAI classes (vLLM 0.33) in both directions:
//
//   - testdata/vllm/prefill_requests.json: the bodies the router sends vLLM
//     for a set of client bodies, written here (-update) and validated by
//     python/tests/test_vllm_router_bodies.py with vLLM's
//     ChatCompletionRequest / CompletionRequest (make test-vllm), down to
//     the kv_transfer_params vLLM hands the connector;
//
//   - testdata/vllm/responses.json: prefill answers built with vLLM's
//     ChatCompletionResponse / CompletionResponse by that Python test, read
//     here by the router's real prefill call.
//
//     go test ./roles/router -run VLLMGolden -update   # after changing the router's prefill body
var updateVLLMGolden = flag.Bool("update", false, "rewrite testdata/vllm/prefill_requests.json")

var vllmGoldenDir = filepath.Join("testdata", "vllm")

// prefillCases are client bodies that reach vLLM, chat and completions.
var prefillCases = []struct {
	Name string          `json:"name"`
	Chat bool            `json:"chat"`
	Body json.RawMessage `json:"client_body"`
}{
	{"chat_stream_usage", true, json.RawMessage(`{"model":"glm-5-tiny","messages":[{"role":"user","content":"Hello"}],"max_tokens":8,"temperature":0.7,"top_p":0.9,"top_k":40,"seed":3,"stream":true,"stream_options":{"include_usage":true}}`)},
	{"chat_defaults", true, json.RawMessage(`{"messages":[{"role":"system","content":"Be brief."},{"role":"user","content":"Why is the sky blue?"}]}`)},
	{"chat_logprobs_stop", true, json.RawMessage(`{"model":"glm-5-tiny","messages":[{"role":"user","content":"Count"}],"max_completion_tokens":12,"logprobs":true,"top_logprobs":3,"stop":["\n\n","END"],"min_tokens":2}`)},
	{"chat_tools", true, json.RawMessage(`{"model":"glm-5-tiny","messages":[{"role":"user","content":"Weather in Paris?"}],"tools":[{"type":"function","function":{"name":"get_weather","description":"weather","parameters":{"type":"object","properties":{"city":{"type":"string"}},"required":["city"]}}}],"tool_choice":"auto","max_tokens":32}`)},
	{"completion_text", false, json.RawMessage(`{"model":"glm-5-tiny","prompt":"The decode engine","max_tokens":16,"stop":["\n"],"temperature":0}`)},
	{"completion_ids_logprobs", false, json.RawMessage(`{"prompt":[5,17,301,42],"max_tokens":4,"logprobs":2,"ignore_eos":true,"stop_token_ids":[7]}`)},
	{"completion_penalty", false, json.RawMessage(`{"prompt":"Say it again and again","max_tokens":8,"repetition_penalty":1.1,"return_tokens_as_token_ids":false}`)},
	{"completion_sampling_extras", false, json.RawMessage(`{"prompt":"Once more","max_tokens":8,"temperature":0.8,"min_p":0.05,"bad_words":["again"," more"],"repetition_detection":{"max_pattern_size":4,"min_count":3},"return_token_ids":true,"return_tokens_as_token_ids":true,"logprobs":1}`)},
	{"chat_reasoning_extras", true, json.RawMessage(`{"messages":[{"role":"user","content":"Think first"}],"max_tokens":64,"thinking_token_budget":16,"prompt_logprobs":1,"return_prompt_text":true,"include_reasoning":false,"parallel_tool_calls":false,"chat_template_kwargs":{"enable_thinking":true}}`)},
}

func goldenRouter(t *testing.T, vllmURL string) (*Router, *node) {
	t.Helper()
	tok, err := tokenizer.Load(tinyModel(t))
	if err != nil {
		t.Fatal(err)
	}
	rt := &Router{tok: tok, served: "glm-5-tiny", names: map[string]bool{"glm-5-tiny": true}, vllm: vllmURL,
		vllmModel: "glm-5-tiny", keepIDs: map[int]bool{}, client: &http.Client{},
		opts: Options{ToolCallParser: "glm47", EnableAutoToolChoice: true, ReasoningParser: "glm45"}}
	rt.thinkStart, _ = tok.Encode("<think>", false)
	rt.thinkEnd, _ = tok.Encode("</think>", false)
	return rt, &node{host: "10.0.0.7", ctrlPort: 5556}
}

// TestVLLMGoldenPrefillRequests writes (with -update) or checks the prefill
// bodies the router sends vLLM.
func TestVLLMGoldenPrefillRequests(t *testing.T) {
	rt, n := goldenRouter(t, "http://127.0.0.1:1")
	type entry struct {
		Name        string          `json:"name"`
		Chat        bool            `json:"chat"`
		Client      json.RawMessage `json:"client_body"`
		Prefill     json.RawMessage `json:"prefill_body"`
		Endpoint    string          `json:"endpoint"`
		WantPrompts bool            `json:"router_wants_prompt_ids"`
	}
	var got []entry
	for i, c := range prefillCases {
		req, e := rt.check(c.Body, c.Chat)
		if e != nil {
			t.Fatalf("%s: the router refused its own golden case: %+v", c.Name, e)
		}
		if req.spillReason != "" {
			t.Fatalf("%s: spilled (%s): not a prefill case", c.Name, req.spillReason)
		}
		b, err := req.prefillBody("glm-5-tiny", n, "tilert-golden-"+string(rune('a'+i)))
		if err != nil {
			t.Fatal(err)
		}
		var m map[string]any // canonical key order
		if err := json.Unmarshal(b, &m); err != nil {
			t.Fatalf("%s: prefill body %s: %v", c.Name, b, err)
		}
		canon, _ := json.Marshal(m)
		ep := "/v1/completions"
		if c.Chat {
			ep = "/v1/chat/completions"
		}
		got = append(got, entry{c.Name, c.Chat, c.Body, canon, ep, req.wantPromptIDs})
	}
	out, err := json.MarshalIndent(got, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	out = append(out, '\n')
	path := filepath.Join(vllmGoldenDir, "prefill_requests.json")
	if *updateVLLMGolden {
		if err := os.MkdirAll(vllmGoldenDir, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, out, 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (go test ./roles/router -run VLLMGolden -update writes it)", err)
	}
	if !bytes.Equal(want, out) {
		t.Fatalf("the router's prefill bodies changed: rerun with -update, then make test-vllm checks them with vLLM's request classes\ngot:\n%s", out)
	}
}

// TestVLLMGoldenResponses feeds the router's prefill call answers built by
// vLLM's own response classes.
func TestVLLMGoldenResponses(t *testing.T) {
	b, err := os.ReadFile(filepath.Join(vllmGoldenDir, "responses.json"))
	if err != nil {
		t.Fatalf("%v (written by python/tests/test_vllm_router_bodies.py with TILERT_UPDATE_GOLDEN=1 under make test-vllm)", err)
	}
	var cases []struct {
		Name   string          `json:"name"`
		Chat   bool            `json:"chat"`
		Client json.RawMessage `json:"client_body"`
		Body   json.RawMessage `json:"vllm_body"`
		Want   struct {
			First        int      `json:"first_token_id"`
			Logprob      *float64 `json:"logprob"`
			Top          [][2]any `json:"top"`
			PromptIDs    []int    `json:"prompt_token_ids"`
			PromptTokens int      `json:"prompt_tokens"`
			Finish       string   `json:"finish_reason"`
			Error        string   `json:"error_code"`
			PromptLPLen  int      `json:"prompt_logprobs_len"`
			PromptText   *string  `json:"prompt_text"`
		} `json:"want"`
	}
	if err := json.Unmarshal(b, &cases); err != nil {
		t.Fatal(err)
	}
	if len(cases) < 4 {
		t.Fatalf("%d response cases", len(cases))
	}
	for _, c := range cases {
		t.Run(c.Name, func(t *testing.T) {
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Content-Type", "application/json")
				_, _ = w.Write(c.Body)
			}))
			defer srv.Close()
			rt, n := goldenRouter(t, srv.URL)
			req, e := rt.check(c.Client, c.Chat)
			if e != nil {
				t.Fatalf("client body refused: %+v", e)
			}
			res, ae := rt.prefill(context.Background(), req, n, "tilert-golden")
			if c.Want.Error != "" {
				if ae == nil || ae.Code != c.Want.Error {
					t.Fatalf("got %+v, %+v; want error %s", res, ae, c.Want.Error)
				}
				return
			}
			if ae != nil {
				t.Fatalf("prefill: %+v", ae)
			}
			if res.first != c.Want.First || res.finish != c.Want.Finish || res.promptTokens != c.Want.PromptTokens {
				t.Fatalf("first %d finish %q prompt_tokens %d; want %d %q %d", res.first, res.finish, res.promptTokens,
					c.Want.First, c.Want.Finish, c.Want.PromptTokens)
			}
			if (c.Want.PromptIDs != nil || res.promptIDs != nil) && !slices.Equal(res.promptIDs, c.Want.PromptIDs) {
				t.Fatalf("prompt ids %v, want %v", res.promptIDs, c.Want.PromptIDs)
			}
			// prompt_logprobs are relayed as vLLM wrote them; only their
			// presence and length are the router's concern.
			var plp []json.RawMessage
			if len(res.promptLogprobs) > 0 {
				if err := json.Unmarshal(res.promptLogprobs, &plp); err != nil {
					t.Fatalf("prompt_logprobs %s: %v", res.promptLogprobs, err)
				}
			}
			if len(plp) != c.Want.PromptLPLen {
				t.Fatalf("prompt_logprobs %s, want %d entries", res.promptLogprobs, c.Want.PromptLPLen)
			}
			if (c.Want.PromptText == nil) != (res.promptText == nil) || (res.promptText != nil && *res.promptText != *c.Want.PromptText) {
				t.Fatalf("prompt_text %v, want %v", res.promptText, c.Want.PromptText)
			}
			switch {
			case c.Want.Logprob == nil && res.firstLP != nil:
				t.Fatalf("logprob %+v, want none", res.firstLP)
			case c.Want.Logprob != nil && (res.firstLP == nil || res.firstLP.P != *c.Want.Logprob):
				t.Fatalf("logprob %+v, want %v", res.firstLP, *c.Want.Logprob)
			case c.Want.Logprob != nil && len(res.firstLP.Top) != len(c.Want.Top):
				t.Fatalf("top %+v, want %v", res.firstLP.Top, c.Want.Top)
			}
			if res.firstLP != nil {
				for i, tp := range c.Want.Top {
					if float64(res.firstLP.Top[i].ID) != tp[0].(float64) || res.firstLP.Top[i].P != tp[1].(float64) {
						t.Fatalf("top[%d] %+v, want %v", i, res.firstLP.Top[i], tp)
					}
				}
			}
		})
	}
}
