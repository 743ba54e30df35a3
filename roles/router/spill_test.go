package router

import (
	"net/http"
	"testing"

	"github.com/tilert-go/tilert/internal/fastserve"
)

// With the TileRT pool full (one slot, no queue), requests go to the spill
// endpoint (`tilert dev-vllm` generating natively plays the native vLLM
// pool) and complete there, streamed and not, as does one of n > 1 (its
// first choice finds the pool full); so do requests the pool cannot serve
// (n past what waves serve). Spills are counted by reason.
func TestSpillWhenFull(t *testing.T) {
	dir := tinyModel(t)
	s := newStack(t, stackOpts{queueSize: 0, hold: true, router: func(o *Options) {
		hs, closeH := devVLLMServer(t, dir, o.Tokenizer)
		native, err := fastserve.Start(hs, "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { native.Close(); closeH() })
		o.SpillURL = native.URL
	}})
	prompt, _ := s.tok.Encode(testPrompt, true)
	ids, _ := s.reference(t, prompt, 6, true)
	want := s.tok.Decode(ids, true)
	body := map[string]any{"prompt": testPrompt, "max_tokens": 6, "temperature": 0, "ignore_eos": true}
	first := make(chan *http.Response, 1)
	go func() { first <- s.post(t, "/v1/completions", body) }()
	<-s.holding // the only slot is taken, parked in prefill

	c := readJSON(t, s.post(t, "/v1/completions", body), false)
	if c.text != want || c.finish != "length" {
		t.Fatalf("spilled: %q %q, want %q length", c.text, c.finish, want)
	}
	body["stream"] = true
	c = readSSE(t, s.post(t, "/v1/completions", body), false)
	if c.text != want || c.finish != "length" {
		t.Fatalf("spilled stream: %q %q, want %q length", c.text, c.finish, want)
	}
	delete(body, "stream")
	body["n"] = 2
	readJSON(t, s.post(t, "/v1/completions", body), false)
	body["n"] = maxWaveGenerations + 1 // dev-vllm answers one choice
	readJSON(t, s.post(t, "/v1/completions", body), false)
	delete(body, "n")
	body["allowed_token_ids"] = []int{5, 6}
	readJSON(t, s.post(t, "/v1/completions", body), false)
	s.hold <- struct{}{}
	if c := readJSON(t, <-first, false); c.text != want {
		t.Fatalf("the TileRT request: %q, want %q", c.text, want)
	}
	for reason, n := range map[string]float64{"pool_full": 3, "n": 1, "allowed_token_ids": 1} {
		if v := metricValue(t, s.router.URL+"/metrics", `tilert_router_spilled_total{reason="`+reason+`"}`); v != n {
			t.Errorf("spilled %s = %v, want %v", reason, v, n)
		}
	}
}
