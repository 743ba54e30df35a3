package router

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/tilert-go/tilert/internal/devvllm"
	"github.com/tilert-go/tilert/openai"
)

const testPrompt = "The decode engine streams tokens to each user"

// Completions through router -> dev-vllm -> decode node equal the CPU
// engine's own generation, streamed or not, with usage.
func TestCompletionsEqualEngine(t *testing.T) {
	s := newStack(t, stackOpts{})
	prompt, err := s.tok.Encode(testPrompt, true)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name      string
		maxTokens int
		ignoreEOS bool
		stream    bool
		usage     bool
	}{
		{"plain", 12, false, false, false},
		{"stream", 12, false, true, false},
		{"stream usage", 20, true, true, true},
		{"one token", 1, true, false, false},
		{"one token stream", 1, true, true, true},
		{"long ignore eos", 40, true, false, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ids, finish := s.reference(t, prompt, tc.maxTokens, tc.ignoreEOS)
			want := s.tok.Decode(ids, true)
			body := map[string]any{"model": "glm-5-tiny", "prompt": testPrompt, "max_tokens": tc.maxTokens, "temperature": 0,
				"ignore_eos": tc.ignoreEOS, "stream": tc.stream}
			if tc.usage {
				body["stream_options"] = map[string]any{"include_usage": true}
			}
			resp := s.post(t, "/v1/completions", body)
			var c completion
			if tc.stream {
				c = readSSE(t, resp, false)
			} else {
				c = readJSON(t, resp, false)
			}
			if c.text != want || c.finish != finish {
				t.Fatalf("text %q finish %q, want %q %q (ids %v)", c.text, c.finish, want, finish, ids)
			}
			if tc.stream && !tc.usage {
				if c.usage != nil {
					t.Fatalf("usage without include_usage: %+v", c.usage)
				}
				return
			}
			wantU := openai.Usage{PromptTokens: len(prompt), CompletionTokens: len(ids), TotalTokens: len(prompt) + len(ids)}
			if c.usage == nil || *c.usage != wantU {
				t.Fatalf("usage %+v, want %+v", c.usage, wantU)
			}
		})
	}
	if v := metricValue(t, s.router.URL+"/metrics", `tilert_router_requests_total{endpoint="completions",outcome="ok"}`); v != 6 {
		t.Fatalf("ok requests %v, want 6", v)
	}
	// max_tokens 1 never reaches /pd/decode; the shipped state is dropped.
	if v := metricValue(t, s.router.URL+"/metrics", `tilert_router_decode_cancels_total{reason="first_token"}`); v != 2 {
		t.Fatalf("first_token cancels %v, want 2", v)
	}
}

func TestChatEqualsEngine(t *testing.T) {
	s := newStack(t, stackOpts{})
	msgs := []map[string]any{{"role": "system", "content": "be brief"}, {"role": "user", "content": testPrompt}}
	raw := make([]json.RawMessage, len(msgs))
	for i, m := range msgs {
		raw[i], _ = json.Marshal(m)
	}
	text, err := devvllm.RenderChat(s.tok, raw)
	if err != nil {
		t.Fatal(err)
	}
	prompt, err := s.tok.Encode(text, false)
	if err != nil {
		t.Fatal(err)
	}
	ids, finish := s.reference(t, prompt, 16, true)
	want := s.tok.Decode(ids, true)
	for _, stream := range []bool{false, true} {
		body := map[string]any{"model": "glm-5-tiny", "messages": msgs, "max_completion_tokens": 16, "max_tokens": 3,
			"temperature": 0, "ignore_eos": true, "stream": stream}
		if stream {
			body["stream_options"] = map[string]any{"include_usage": true}
		}
		resp := s.post(t, "/v1/chat/completions", body)
		var c completion
		if stream {
			c = readSSE(t, resp, true)
		} else {
			c = readJSON(t, resp, true)
		}
		if c.text != want || c.finish != finish {
			t.Fatalf("stream %v: text %q finish %q, want %q %q", stream, c.text, c.finish, want, finish)
		}
		if c.usage == nil || c.usage.CompletionTokens != len(ids) || c.usage.PromptTokens != len(prompt) {
			t.Fatalf("stream %v: usage %+v, want %d prompt %d completion", stream, c.usage, len(prompt), len(ids))
		}
	}
}

// Stop strings end the text before the stop (or after it with
// include_stop_str_in_output), streamed or not, and cancel the node.
func TestStopStrings(t *testing.T) {
	s := newStack(t, stackOpts{})
	prompt, _ := s.tok.Encode(testPrompt, true)
	ids, _ := s.reference(t, prompt, 40, true)
	full := s.tok.Decode(ids, true)
	runes := []rune(full)
	if len(runes) < 24 {
		t.Fatalf("reference text too short for the test: %q", full)
	}
	stop := string(runes[12:16])
	at := strings.Index(full, stop)
	for _, tc := range []struct {
		name    string
		stop    any
		include bool
		want    string
	}{
		{"string", stop, false, full[:at]},
		{"array with a miss", []string{"\x00never\x00", stop}, false, full[:at]},
		{"include", []string{stop}, true, full[:at+len(stop)]},
	} {
		for _, stream := range []bool{false, true} {
			body := map[string]any{"prompt": testPrompt, "max_tokens": 40, "temperature": 0, "ignore_eos": true, "stop": tc.stop,
				"include_stop_str_in_output": tc.include, "stream": stream}
			resp := s.post(t, "/v1/completions", body)
			var c completion
			if stream {
				c = readSSE(t, resp, false)
			} else {
				c = readJSON(t, resp, false)
			}
			if c.text != tc.want || c.finish != "stop" {
				t.Fatalf("%s stream %v: text %q finish %q, want %q stop (full %q, stop %q)", tc.name, stream, c.text, c.finish, tc.want, full, stop)
			}
		}
	}
	// A stop string that never shows: the full text, finish length.
	c := readJSON(t, s.post(t, "/v1/completions", map[string]any{"prompt": testPrompt, "max_tokens": 40, "temperature": 0,
		"ignore_eos": true, "stop": "\x01no\x01"}), false)
	if c.text != full || c.finish != "length" {
		t.Fatalf("text %q finish %q, want %q length", c.text, c.finish, full)
	}
	if v := metricValue(t, s.router.URL+"/metrics", `tilert_router_decode_cancels_total{reason="stop_string"}`); v < 1 {
		t.Fatalf("stop_string cancels %v", v)
	}
}

// With the node's one slot taken and no queue, a second request gets 429
// with Retry-After; with a queue, it waits and is served once the slot is
// free, or gets 429 past the queue deadline.
func TestGateRejects(t *testing.T) {
	s := newStack(t, stackOpts{queueSize: 1, queueTimeout: 300 * time.Millisecond, hold: true})
	body := map[string]any{"prompt": testPrompt, "max_tokens": 4, "temperature": 0}
	first := make(chan *http.Response, 1)
	go func() { first <- s.post(t, "/v1/completions", body) }()
	<-s.holding // the first request holds the slot, parked in prefill

	// Queue of one: the second waits past its deadline -> 429 queue_timeout.
	resp := s.post(t, "/v1/completions", body)
	checkError(t, resp, http.StatusTooManyRequests, "", "queue_timeout")
	if resp.Header.Get("Retry-After") == "" {
		t.Fatal("429 without Retry-After")
	}
	// Fill the queue with one waiter (no deadline to race against now), then
	// a third is refused at once.
	s.rt.queueTimeout.Store(int64(time.Hour))
	second := make(chan *http.Response, 1)
	go func() {
		b, _ := json.Marshal(body)
		r, err := http.Post(s.router.URL+"/v1/completions", "application/json", strings.NewReader(string(b)))
		if err != nil {
			t.Error(err)
		}
		second <- r
	}()
	eventually(t, "a request queued", func() bool { return s.rt.gate.queued() == 1 })
	resp = s.post(t, "/v1/completions", body)
	checkError(t, resp, http.StatusTooManyRequests, "", "queue_full")
	if v := metricValue(t, s.router.URL+"/metrics", "tilert_router_queue_depth"); v != 1 {
		t.Fatalf("queue depth %v, want 1", v)
	}
	s.hold <- struct{}{} // release the first
	readJSON(t, <-first, false)
	<-s.holding // the queued one got the slot and reached prefill
	s.hold <- struct{}{}
	if r := <-second; r != nil {
		readJSON(t, r, false)
	}
	for reason, want := range map[string]float64{"queue_full": 1, "queue_timeout": 1} {
		if v := metricValue(t, s.router.URL+"/metrics", `tilert_router_queue_rejects_total{reason="`+reason+`"}`); v != want {
			t.Fatalf("%s rejects %v, want %v", reason, v, want)
		}
	}
}

// A client that leaves mid-stream makes the router cancel the request on
// the node, which ends its decode as cancelled.
func TestClientGoneCancels(t *testing.T) {
	s := newStack(t, stackOpts{maxSeqLen: 4096})
	ctx, cancel := context.WithCancel(context.Background())
	b, _ := json.Marshal(map[string]any{"prompt": testPrompt, "max_tokens": 4000, "temperature": 0, "ignore_eos": true, "stream": true})
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, s.router.URL+"/v1/completions", strings.NewReader(string(b)))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 64)
	if _, err := io.ReadAtLeast(resp.Body, buf, 1); err != nil {
		t.Fatal(err)
	}
	cancel()
	_ = resp.Body.Close()
	nodeMetrics := "http://" + s.node.HTTP + "/metrics"
	eventually(t, "the node counts the request cancelled", func() bool {
		return metricValue(t, nodeMetrics, `tilert_decode_requests_total{outcome="cancelled"}`) == 1
	})
	eventually(t, "the router counts it cancelled", func() bool {
		return metricValue(t, s.router.URL+"/metrics", `tilert_router_requests_total{endpoint="completions",outcome="cancelled"}`) == 1
	})
	if v := metricValue(t, s.router.URL+"/metrics", `tilert_router_decode_cancels_total{reason="client_gone"}`); v != 1 {
		t.Fatalf("client_gone cancels %v, want 1", v)
	}
	// The slot is free again: a next request is served.
	c := readJSON(t, s.post(t, "/v1/completions", map[string]any{"prompt": testPrompt, "max_tokens": 3, "temperature": 0}), false)
	if c.usage == nil || c.usage.CompletionTokens == 0 {
		t.Fatalf("no completion after a cancel: %+v", c)
	}
}

func TestVLLMDown(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	url := "http://" + ln.Addr().String()
	_ = ln.Close()
	s := newStack(t, stackOpts{vllmURL: url})
	for _, path := range []string{"/v1/completions", "/v1/chat/completions"} {
		resp := s.post(t, path, map[string]any{"model": "glm-5-tiny", "prompt": "hi", "messages": []any{map[string]any{"role": "user", "content": "hi"}}})
		msg := checkError(t, resp, http.StatusBadGateway, "", "prefill_unavailable")
		if !strings.Contains(msg, url) {
			t.Fatalf("message %q does not name the vLLM URL", msg)
		}
	}
	// The slot was given back both times.
	if b, _ := s.rt.gate.busy(); b != 0 {
		t.Fatalf("%d slots still busy", b)
	}
}

// checkError checks an OpenAI-style error body and returns its message.
func checkError(t *testing.T, resp *http.Response, status int, param, code string) string {
	t.Helper()
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != status {
		t.Fatalf("status %d, want %d: %s", resp.StatusCode, status, b)
	}
	var e struct {
		Error struct {
			Message string  `json:"message"`
			Type    string  `json:"type"`
			Param   *string `json:"param"`
			Code    *string `json:"code"`
		} `json:"error"`
	}
	if err := json.Unmarshal(b, &e); err != nil || e.Error.Message == "" || e.Error.Type == "" {
		t.Fatalf("not an OpenAI error body: %s", b)
	}
	if param != "" && (e.Error.Param == nil || *e.Error.Param != param) {
		t.Fatalf("param %v, want %q: %s", e.Error.Param, param, b)
	}
	if code != "" && (e.Error.Code == nil || *e.Error.Code != code) {
		t.Fatalf("code %v, want %q: %s", e.Error.Code, code, b)
	}
	return e.Error.Message
}

func TestBadRequests(t *testing.T) {
	s := newStack(t, stackOpts{})
	msgs := `"messages":[{"role":"user","content":"hi"}]`
	for _, tc := range []struct {
		name, path, body, param, inMsg string
	}{
		{"not json", "/v1/completions", `{"prompt":`, "", "not a JSON object"},
		{"array body", "/v1/completions", `[1,2]`, "", "not a JSON object"},
		{"unknown model", "/v1/completions", `{"model":"gpt-4","prompt":"hi"}`, "model", "gpt-4"},
		{"model not a string", "/v1/completions", `{"model":3,"prompt":"hi"}`, "model", "not a string"},
		{"no prompt", "/v1/completions", `{"max_tokens":3}`, "prompt", "missing"},
		{"empty prompt", "/v1/completions", `{"prompt":""}`, "prompt", "empty"},
		{"prompts x n past the wave cap", "/v1/completions", `{"prompt":["a","b"],"n":513}`, "prompt", "2 prompts x n=513 is more than the 1024 generations"},
		{"max_tokens 0", "/v1/completions", `{"prompt":"hi","max_tokens":0}`, "max_tokens", ">= 1"},
		{"max_tokens fraction", "/v1/completions", `{"prompt":"hi","max_tokens":1.5}`, "max_tokens", "whole number"},
		{"max_tokens string", "/v1/completions", `{"prompt":"hi","max_tokens":"8"}`, "max_tokens", "not a number"},
		{"n past the wave cap", "/v1/completions", `{"prompt":"hi","n":1025}`, "n", "n=1025 is more than the 1024 generations"},
		{"n overflowing", "/v1/completions", `{"prompt":["a","b"],"n":9223372036854775807}`, "prompt", "generations"},
		{"best_of", "/v1/completions", `{"prompt":"hi","best_of":3}`, "best_of", "best_of"},
		{"echo", "/v1/completions", `{"prompt":"hi","echo":true}`, "echo", "echo"},
		{"logprobs too many", "/v1/completions", `{"prompt":"hi","logprobs":21}`, "logprobs", "greater than max allowed: 20"},
		{"logprobs negative", "/v1/completions", `{"prompt":"hi","logprobs":-1}`, "logprobs", "non-negative"},
		{"stream_options without stream", "/v1/completions", `{"prompt":"hi","stream_options":{"include_usage":true}}`, "stream_options", "stream true"},
		{"include_usage type", "/v1/completions", `{"prompt":"hi","stream":true,"stream_options":{"include_usage":"yes"}}`, "stream_options.include_usage", "boolean"},
		{"temperature", "/v1/completions", `{"prompt":"hi","temperature":-1}`, "temperature", "negative"},
		{"top_p", "/v1/completions", `{"prompt":"hi","top_p":2}`, "top_p", "(0, 1]"},
		{"stop type", "/v1/completions", `{"prompt":"hi","stop":5}`, "stop", "strings"},
		{"presence penalty range", "/v1/completions", `{"prompt":"hi","presence_penalty":2.5}`, "presence_penalty", "[-2, 2], got 2.5"},
		{"frequency penalty range", "/v1/completions", `{"prompt":"hi","frequency_penalty":-3}`, "frequency_penalty", "[-2, 2]"},
		{"repetition penalty", "/v1/completions", `{"prompt":"hi","repetition_penalty":0}`, "repetition_penalty", "greater than zero"},
		{"min_tokens > max_tokens", "/v1/completions", `{"prompt":"hi","max_tokens":3,"min_tokens":4}`, "min_tokens", "max_tokens=3"},
		{"logit_bias key", "/v1/completions", `{"prompt":"hi","logit_bias":{"x":1}}`, "logit_bias", "not a token id"},
		{"logit_bias out of vocab", "/v1/completions", `{"prompt":"hi","logit_bias":{"99999999":1}}`, "logit_bias", "out-of-vocab"},
		{"top_k", "/v1/completions", `{"prompt":"hi","top_k":-2}`, "top_k", "at least 1"},
		{"chat no messages", "/v1/chat/completions", `{"messages":[]}`, "messages", "empty"},
		{"chat n", "/v1/chat/completions", `{` + msgs + `,"n":2000}`, "n", "n=2000 is more than"},
		{"chat max_completion_tokens", "/v1/chat/completions", `{` + msgs + `,"max_completion_tokens":-2}`, "max_completion_tokens", ">= 1"},
		{"chat tools without a parser", "/v1/chat/completions", `{` + msgs + `,"tools":[{"type":"function","function":{"name":"f"}}]}`, "tool_choice", "--tool-call-parser"},
		{"chat tool_choice unknown function", "/v1/chat/completions", `{` + msgs + `,"tools":[{"type":"function","function":{"name":"f"}}],"tool_choice":{"type":"function","function":{"name":"g"}}}`, "tool_choice", "not among the tools"},
		{"chat top_logprobs without logprobs", "/v1/chat/completions", `{` + msgs + `,"top_logprobs":2}`, "top_logprobs", "`logprobs` must be set to true"},
		{"chat response_format", "/v1/chat/completions", `{` + msgs + `,"response_format":{"type":"json_object"}}`, "response_format", "structured"},
		{"min_p range", "/v1/completions", `{"prompt":"hi","min_p":-0.1}`, "min_p", "min_p must be in [0, 1], got -0.1."},
		{"bad_words empty", "/v1/completions", `{"prompt":"hi","bad_words":[""]}`, "bad_words", "empty string"},
		{"bad_words whitespace", "/v1/completions", `{"prompt":"hi","bad_words":["  "]}`, "bad_words", "at least one token"},
		{"thinking budget without a reasoning parser", "/v1/completions", `{"prompt":"hi","thinking_token_budget":8}`, "thinking_token_budget", "--reasoning-parser"},
		{"beam search", "/v1/completions", `{"prompt":"hi","use_beam_search":true}`, "use_beam_search", "beam search is not supported by the TileRT decode pool"},
		{"chat structured_outputs", "/v1/chat/completions", `{` + msgs + `,"structured_outputs":{"regex":"a+"}}`, "structured_outputs", "--spill-url"},
		{"chat echo", "/v1/chat/completions", `{` + msgs + `,"echo":true}`, "echo", "echo"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			resp, err := http.Post(s.router.URL+tc.path, "application/json", strings.NewReader(tc.body))
			if err != nil {
				t.Fatal(err)
			}
			msg := checkError(t, resp, http.StatusBadRequest, tc.param, "")
			if !strings.Contains(msg, tc.inMsg) {
				t.Fatalf("message %q lacks %q", msg, tc.inMsg)
			}
		})
	}
	if b, _ := s.rt.gate.busy(); b != 0 {
		t.Fatalf("%d slots busy after refused requests", b)
	}
	// Wrong method and unknown paths are JSON errors too.
	resp, err := http.Get(s.router.URL + "/v1/completions")
	if err != nil {
		t.Fatal(err)
	}
	checkError(t, resp, http.StatusMethodNotAllowed, "", "")
	resp, err = http.Get(s.router.URL + "/v1/embeddings")
	if err != nil {
		t.Fatal(err)
	}
	checkError(t, resp, http.StatusNotFound, "", "")
}

func TestModelsHealthMetrics(t *testing.T) {
	s := newStack(t, stackOpts{maxInflight: 2})
	var models struct {
		Object string `json:"object"`
		Data   []struct {
			ID          string `json:"id"`
			MaxModelLen int    `json:"max_model_len"`
		} `json:"data"`
	}
	if err := s.rt.getJSON(context.Background(), s.router.URL+"/v1/models", &models); err != nil {
		t.Fatal(err)
	}
	// No --served-model-name: vLLM's served name is learnt.
	if models.Object != "list" || len(models.Data) != 1 || models.Data[0].ID != "glm-5-tiny" || models.Data[0].MaxModelLen != 256 {
		t.Fatalf("/v1/models: %+v", models)
	}
	var h struct {
		Status string `json:"status"`
		Slots  int    `json:"slots"`
	}
	if err := s.rt.getJSON(context.Background(), s.router.URL+"/health", &h); err != nil {
		t.Fatal(err)
	}
	if h.Status != "ok" || h.Slots != 2 {
		t.Fatalf("/health: %+v", h)
	}
	readJSON(t, s.post(t, "/v1/completions", map[string]any{"prompt": testPrompt, "max_tokens": 5, "temperature": 0, "ignore_eos": true}), false)
	for series, want := range map[string]float64{
		"tilert_router_slots":                           2,
		"tilert_router_slots_busy":                      0,
		`tilert_router_tokens_total{kind="completion"}`: 5,
		"tilert_router_ttft_seconds_count":              1,
	} {
		if v := metricValue(t, s.router.URL+"/metrics", series); v != want {
			t.Errorf("%s = %v, want %v", series, v, want)
		}
	}
	// 4 tokens came from the node, at most 2 per line (MTP); the first line
	// is not an inter-token gap.
	if v := metricValue(t, s.router.URL+"/metrics", "tilert_router_inter_token_seconds_count"); v < 2 || v > 3 {
		t.Errorf("inter-token samples %v, want 2 or 3", v)
	}
}

// A prompt vLLM refuses (here: longer than the prefill takes) is the
// client's 400, in vLLM's words.
func TestPrefillRefusalPassesThrough(t *testing.T) {
	s := newStack(t, stackOpts{})
	long := make([]int, 1100) // dev-vllm prefills at most 1024 positions in these tests
	for i := range long {
		long[i] = 5 + i%200
	}
	resp := s.post(t, "/v1/completions", map[string]any{"prompt": long, "max_tokens": 4})
	msg := checkError(t, resp, http.StatusBadRequest, "", "")
	if !strings.Contains(msg, "vLLM prefill refused") || !strings.Contains(msg, "too long") {
		t.Fatalf("message %q", msg)
	}
	if v := metricValue(t, s.router.URL+"/metrics", `tilert_router_requests_total{endpoint="completions",outcome="prefill_error"}`); v != 1 {
		t.Fatalf("prefill_error %v", v)
	}
}

// A vLLM that answers but never ships the state (the TileRT connector not
// loaded): the node times out waiting, and the router says so, as a 504
// (non-streamed) or an error event after the first token (streamed).
func TestStateNeverArrives(t *testing.T) {
	noConnector := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodGet {
			_, _ = w.Write([]byte(`{"object":"list","data":[{"id":"glm-5-tiny"}]}`))
			return
		}
		_, _ = w.Write([]byte(`{"choices":[{"index":0,"text":"x","finish_reason":"length","logprobs":{"tokens":["token_id:300"]}}],"usage":{"prompt_tokens":3}}`))
	}))
	defer noConnector.Close()
	s := newStack(t, stackOpts{vllmURL: noConnector.URL, stateTimeout: 0.2})
	body := map[string]any{"prompt": "hi", "max_tokens": 4}
	msg := checkError(t, s.post(t, "/v1/completions", body), http.StatusGatewayTimeout, "", "kv_transfer_timeout")
	if !strings.Contains(msg, "TileRT connector") {
		t.Fatalf("message %q", msg)
	}
	body["stream"] = true
	resp := s.post(t, "/v1/completions", body)
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(b), `"code":"kv_transfer_timeout"`) || !strings.HasSuffix(string(b), "data: [DONE]\n\n") {
		t.Fatalf("stream: %s %s", resp.Status, b)
	}
	if v := metricValue(t, s.router.URL+"/metrics", `tilert_router_requests_total{endpoint="completions",outcome="decode_error"}`); v != 2 {
		t.Fatalf("decode_error %v, want 2", v)
	}
}

// A client that leaves while nothing is being written to it (its request
// waits in the queue, or in prefill) is noticed at once: fasthttp does not
// read the connection during a handler, the router's watch does (internal/fastserve/watch.go).
func TestClientGoneWhileWaiting(t *testing.T) {
	s := newStack(t, stackOpts{queueSize: 4, hold: true})
	body, _ := json.Marshal(map[string]any{"prompt": testPrompt, "max_tokens": 4, "temperature": 0, "stream": true})
	first := make(chan *http.Response, 1)
	go func() { first <- s.post(t, "/v1/completions", json.RawMessage(body)) }()
	<-s.holding // the first request holds the only slot, parked in prefill

	// The second waits in the queue; its client leaves.
	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, s.router.URL+"/v1/completions", bytes.NewReader(body))
		if resp, err := http.DefaultClient.Do(req); err == nil {
			resp.Body.Close()
		}
	}()
	eventually(t, "a request queued", func() bool { return s.rt.gate.queued() == 1 })
	cancel()
	eventually(t, "the queued request leaves the queue", func() bool { return s.rt.gate.queued() == 0 })

	// A third gets the slot after the first; its client leaves while its
	// prefill is parked (the router writes nothing before the first token).
	s.hold <- struct{}{}
	readSSE(t, <-first, false)
	ctx3, cancel3 := context.WithCancel(context.Background())
	go func() {
		req, _ := http.NewRequestWithContext(ctx3, http.MethodPost, s.router.URL+"/v1/completions", bytes.NewReader(body))
		if resp, err := http.DefaultClient.Do(req); err == nil {
			resp.Body.Close()
		}
	}()
	<-s.holding
	cancel3()
	eventually(t, "both leavers counted cancelled while the prefill is still parked", func() bool {
		return metricValue(t, s.router.URL+"/metrics", `tilert_router_requests_total{endpoint="completions",outcome="cancelled"}`) == 2
	})
	if b, _ := s.rt.gate.busy(); b != 0 {
		t.Fatalf("%d slots busy after the clients left", b)
	}
	s.hold <- struct{}{} // let the parked prefill go; nobody waits for it
}
