package router

import (
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/tilert-go/tilert/engine"
	"github.com/tilert-go/tilert/openai"
)

// nChoices reads every choice of a JSON answer or of an SSE stream by
// index: its text (chat content or completion text) and finish reason; and
// the usage, the [DONE] count and the stream's error events.
type nResult struct {
	text, finish map[int]string
	usage        *openai.Usage
	usages, done int
}

func readN(t *testing.T, resp *http.Response, stream bool) nResult {
	t.Helper()
	r := nResult{text: map[int]string{}, finish: map[int]string{}}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("status %s: %s", resp.Status, b)
	}
	raws := []string{string(b)}
	if stream { // SSE events, the choices' chunks interleaved
		raws = nil
		for _, line := range strings.Split(string(b), "\n") {
			if ev, ok := strings.CutPrefix(line, "data: "); ok {
				raws = append(raws, ev)
			}
		}
	}
	for _, raw := range raws {
		if raw == "[DONE]" {
			r.done++
			continue
		}
		var a struct {
			Choices []struct {
				Index   int    `json:"index"`
				Text    string `json:"text"`
				Message *struct {
					Content string `json:"content"`
				} `json:"message"`
				Delta *struct {
					Content *string `json:"content"`
				} `json:"delta"`
				FinishReason *string `json:"finish_reason"`
			} `json:"choices"`
			Usage *openai.Usage `json:"usage"`
		}
		if err := json.Unmarshal([]byte(raw), &a); err != nil {
			t.Fatalf("%v: %s", err, raw)
		}
		if a.Usage != nil {
			r.usage = a.Usage
			r.usages++
		}
		for _, c := range a.Choices {
			r.text[c.Index] += c.Text
			if c.Message != nil {
				r.text[c.Index] += c.Message.Content
			}
			if c.Delta != nil && c.Delta.Content != nil {
				r.text[c.Index] += *c.Delta.Content
			}
			if c.FinishReason != nil {
				r.finish[c.Index] = *c.FinishReason
			}
		}
	}
	return r
}

// n > 1: n generations on n slots, choice i sampled with seed + i as vLLM
// seeds them, each equal to the engine's own generation with that seed;
// the prompt's tokens counted once in the usage; streamed, the chunks of
// the n choices interleave by index and end with one usage chunk and one
// [DONE]. An n past what waves serve is refused; the slots are all free
// afterwards.
func TestNChoices(t *testing.T) {
	s := newStack(t, stackOpts{maxInflight: 4})
	prompt, _ := s.tok.Encode(testPrompt, true)
	const n, maxTokens, seed = 3, 8, 11
	want := map[int]string{}
	for i := range n {
		ids, _, _ := s.referenceP(t, prompt, engine.Params{MaxTokens: maxTokens, Temperature: 0.9, TopP: 1, Seed: seed + uint64(i)})
		want[i] = s.tok.Decode(ids, true)
	}
	if want[0] == want[1] && want[1] == want[2] {
		t.Fatal("three seeds gave one text: the test would prove nothing")
	}
	for _, stream := range []bool{false, true} {
		body := map[string]any{"prompt": testPrompt, "max_tokens": maxTokens, "temperature": 0.9, "top_p": 1, "top_k": 0,
			"seed": seed, "ignore_eos": true, "n": n, "stream": stream}
		if stream {
			body["stream_options"] = map[string]any{"include_usage": true}
		}
		r := readN(t, s.post(t, "/v1/completions", body), stream)
		for i := range n {
			if r.text[i] != want[i] || r.finish[i] != "length" {
				t.Errorf("stream=%v choice %d: %q (%s), want the engine's %q with seed %d", stream, i, r.text[i], r.finish[i], want[i], seed+i)
			}
		}
		if len(r.text) != n || r.usages != 1 || r.usage.PromptTokens != len(prompt) || r.usage.CompletionTokens != n*maxTokens {
			t.Errorf("stream=%v: %d choices, usage %+v (%d times)", stream, len(r.text), r.usage, r.usages)
		}
		if stream && r.done != 1 {
			t.Errorf("stream: %d [DONE]", r.done)
		}
	}
	// Greedy chat: n equal choices.
	chat := map[string]any{"messages": []any{map[string]any{"role": "user", "content": testPrompt}}, "max_tokens": 5,
		"temperature": 0, "ignore_eos": true, "n": 2}
	cr := readN(t, s.post(t, "/v1/chat/completions", chat), false)
	if len(cr.text) != 2 || cr.text[0] != cr.text[1] || cr.text[0] == "" || cr.usage.CompletionTokens != 10 {
		t.Fatalf("greedy chat n=2: %+v", cr)
	}
	resp := s.post(t, "/v1/completions", map[string]any{"prompt": testPrompt, "n": maxWaveGenerations + 1})
	checkError(t, resp, http.StatusBadRequest, "n", "")
	deadline := time.Now().Add(5 * time.Second)
	for b, _ := s.rt.gate.busy(); b != 0; b, _ = s.rt.gate.busy() {
		if time.Now().After(deadline) {
			t.Fatalf("%d slots busy after the requests", b)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// One choice that cannot start fails the request: the others' states are
// dropped on their nodes and every slot is free again.
func TestNChoicesOneFails(t *testing.T) {
	var mu sync.Mutex
	posts := 0
	s := newStack(t, stackOpts{maxInflight: 4, vllmWrap: func(inner fasthttp.RequestHandler) fasthttp.RequestHandler {
		return func(ctx *fasthttp.RequestCtx) {
			mu.Lock()
			posts++
			k := posts
			mu.Unlock()
			if k == 2 { // the second prefill of the request
				ctx.SetStatusCode(http.StatusInternalServerError)
				ctx.SetBodyString(`{"error":{"message":"boom","type":"InternalServerError","code":500}}`)
				return
			}
			inner(ctx)
		}
	}})
	resp := s.post(t, "/v1/completions", map[string]any{"prompt": testPrompt, "max_tokens": 4, "n": 3})
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusBadGateway {
		t.Fatalf("%s: %s, want 502", resp.Status, b)
	}
	deadline := time.Now().Add(5 * time.Second)
	for b, _ := s.rt.gate.busy(); b != 0; b, _ = s.rt.gate.busy() {
		if time.Now().After(deadline) {
			t.Fatalf("%d slots busy after the failed request", b)
		}
		time.Sleep(10 * time.Millisecond)
	}
	// The pool serves the next request of n = 4 (every node slot free too).
	r := readN(t, s.post(t, "/v1/completions", map[string]any{"prompt": testPrompt, "max_tokens": 4, "n": 4, "temperature": 0}), false)
	if len(r.text) != 4 {
		t.Fatalf("after the failure: %+v", r)
	}
}

// Two requests of n = 3 on a pool of 4 slots both complete: one takes its
// slots, the other waits for it to finish rather than holding a part.
func TestNChoicesConcurrent(t *testing.T) {
	s := newStack(t, stackOpts{maxInflight: 4, queueSize: 8})
	var wg sync.WaitGroup
	resps := make([]*http.Response, 4)
	for i := range resps {
		wg.Add(1)
		go func() { // the answers are read below, on the test's goroutine
			defer wg.Done()
			resps[i] = s.post(t, "/v1/completions", map[string]any{"prompt": testPrompt, "max_tokens": 6, "n": 3,
				"temperature": 0, "ignore_eos": true, "stream": i%2 == 1})
		}()
	}
	wg.Wait()
	for i, resp := range resps {
		if r := readN(t, resp, i%2 == 1); len(r.text) != 3 || r.text[0] != r.text[2] {
			t.Errorf("request %d: %+v", i, r)
		}
	}
}

// A completions batch: prompt p's choice j is index p * n + j, sampled with
// seed + j, equal to the engine's own; usage counts each prompt once.
func TestPromptBatch(t *testing.T) {
	s := newStack(t, stackOpts{maxInflight: 4})
	const n, maxTokens, seed = 2, 6, 5
	second := "Tokens stream to users"
	p0, _ := s.tok.Encode(testPrompt, true)
	p1, _ := s.tok.Encode(second, true)
	ids1 := p1[1:] // sent as token ids, the BOS left out as a client would
	want := map[int]string{}
	for p, prompt := range [][]int{p0, ids1} {
		for j := range n {
			ids, _, _ := s.referenceP(t, prompt, engine.Params{MaxTokens: maxTokens, Temperature: 0.8, TopP: 1, Seed: seed + uint64(j)})
			want[p*n+j] = s.tok.Decode(ids, true)
		}
	}
	for _, stream := range []bool{false, true} {
		body := map[string]any{"prompt": []any{testPrompt, ids1}, "max_tokens": maxTokens, "temperature": 0.8, "top_p": 1,
			"top_k": 0, "seed": seed, "ignore_eos": true, "n": n, "stream": stream}
		if stream {
			body["stream_options"] = map[string]any{"include_usage": true}
		}
		r := readN(t, s.post(t, "/v1/completions", body), stream)
		for i := range 2 * n {
			if r.text[i] != want[i] {
				t.Errorf("stream=%v choice %d: %q, want the engine's %q", stream, i, r.text[i], want[i])
			}
		}
		if r.usage == nil || r.usage.PromptTokens != len(p0)+len(ids1) || r.usage.CompletionTokens != 2*n*maxTokens {
			t.Errorf("stream=%v: usage %+v, want %d prompt tokens", stream, r.usage, len(p0)+len(ids1))
		}
	}
}
