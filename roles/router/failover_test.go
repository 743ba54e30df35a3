package router

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"
)

func healthStatus(t *testing.T, url string) int {
	t.Helper()
	resp, err := http.Get(url + "/health")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	return resp.StatusCode
}

// With its only node gone the router says so: /health 503, requests 503
// decode_unavailable (not prefill_failed: prefill is fine); when the node
// returns, /health is 200 again and requests are served.
func TestNodeDownAndBack(t *testing.T) {
	s := newStack(t, stackOpts{proxy: true})
	if st := healthStatus(t, s.router.URL); st != http.StatusOK {
		t.Fatalf("/health %d with the node up", st)
	}
	s.proxies[0][0].kill()
	s.proxies[0][1].kill()
	eventually(t, "/health 503 with no node up", func() bool { return healthStatus(t, s.router.URL) == http.StatusServiceUnavailable })
	body := map[string]any{"prompt": testPrompt, "max_tokens": 4, "temperature": 0}
	resp := s.post(t, "/v1/completions", body)
	if resp.Header.Get("Retry-After") == "" {
		t.Error("503 without Retry-After")
	}
	msg := checkError(t, resp, http.StatusServiceUnavailable, "", "decode_unavailable")
	if !strings.Contains(msg, "no decode node is up") {
		t.Fatalf("message %q", msg)
	}
	s.proxies[0][0].revive()
	s.proxies[0][1].revive()
	eventually(t, "/health 200 once the node is back", func() bool { return healthStatus(t, s.router.URL) == http.StatusOK })
	c := readJSON(t, s.post(t, "/v1/completions", body), false)
	if c.usage == nil || c.usage.CompletionTokens != 4 {
		t.Fatalf("after the node came back: %+v", c)
	}
}

// A node that dies between the health checks: the prefill for it fails
// (vLLM's connector cannot reach it), the router finds the node dead and
// prefills again for the other node; the client sees a normal answer.
func TestPrefillFailoverToOtherNode(t *testing.T) {
	s := newStack(t, stackOpts{nodes: 2, proxy: true, router: func(o *Options) { o.HealthInterval = time.Hour }})
	prompt, _ := s.tok.Encode(testPrompt, true)
	want, _ := s.reference(t, prompt, 6, true)
	s.proxies[0][0].kill()
	s.proxies[0][1].kill()
	for i := 0; i < 3; i++ { // whichever node the gate picks first
		c := readJSON(t, s.post(t, "/v1/completions", map[string]any{"prompt": testPrompt, "max_tokens": 6, "temperature": 0, "ignore_eos": true}), false)
		if c.text != s.tok.Decode(want, true) {
			t.Fatalf("request %d: %q, want %q", i, c.text, s.tok.Decode(want, true))
		}
	}
	if v := metricValue(t, s.router.URL+"/metrics", "tilert_router_nodes_up"); v != 1 {
		t.Fatalf("nodes up %v, want 1", v)
	}
}

// Two nodes, one killed mid-load: no request is lost. Each streamed
// request completes (on either node, with the engine's exact text) or, if
// its node died after its first decoded token, ends with an error event;
// none is refused, none hangs.
func TestKillNodeMidLoad(t *testing.T) {
	s := newStack(t, stackOpts{nodes: 2, maxInflight: 2, proxy: true, queueSize: 64, queueTimeout: 5 * time.Minute})
	const n, maxTokens = 16, 24
	prompt, _ := s.tok.Encode(testPrompt, true)
	ids, _ := s.reference(t, prompt, maxTokens, true)
	want := s.tok.Decode(ids, true)
	type result struct {
		status      int
		text        string
		finish      string
		errAfterTok bool
	}
	results := make([]result, n)
	var wg sync.WaitGroup
	started := make(chan struct{}, n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			b, _ := json.Marshal(map[string]any{"prompt": testPrompt, "max_tokens": maxTokens, "temperature": 0, "ignore_eos": true, "stream": true})
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			req, _ := http.NewRequestWithContext(ctx, http.MethodPost, s.router.URL+"/v1/completions", strings.NewReader(string(b)))
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				results[i].status = -1
				return
			}
			defer resp.Body.Close()
			results[i].status = resp.StatusCode
			sc := bufio.NewScanner(resp.Body)
			tokens := 0
			for sc.Scan() {
				data, ok := strings.CutPrefix(sc.Text(), "data: ")
				if !ok || data == "[DONE]" {
					continue
				}
				var m struct {
					Choices []struct {
						Text         string  `json:"text"`
						FinishReason *string `json:"finish_reason"`
					} `json:"choices"`
					Error *struct {
						Code string `json:"code"`
					} `json:"error"`
				}
				if json.Unmarshal([]byte(data), &m) != nil {
					continue
				}
				if m.Error != nil {
					results[i].errAfterTok = tokens > 0
					return
				}
				for _, c := range m.Choices {
					if c.Text != "" && tokens == 0 {
						started <- struct{}{}
					}
					results[i].text += c.Text
					tokens++
					if c.FinishReason != nil {
						results[i].finish = *c.FinishReason
					}
				}
			}
		}()
	}
	// Kill node 0 once a few requests are streaming.
	for range 3 {
		<-started
	}
	s.proxies[0][0].kill()
	s.proxies[0][1].kill()
	wg.Wait()
	completed, erred := 0, 0
	for i, r := range results {
		switch {
		case r.status != http.StatusOK:
			t.Errorf("request %d: status %d", i, r.status)
		case r.errAfterTok:
			erred++
		case r.finish == "length" && r.text == want:
			completed++
		default:
			t.Errorf("request %d: neither complete nor a clear error: %+v", i, r)
		}
	}
	t.Logf("%d completed, %d ended with an error after their first token; failovers: prefill %v decode %v", completed, erred,
		metricValue(t, s.router.URL+"/metrics", `tilert_router_failovers_total{stage="prefill"}`),
		metricValue(t, s.router.URL+"/metrics", `tilert_router_failovers_total{stage="decode"}`))
	if completed+erred != n || completed == 0 {
		t.Fatalf("%d completed + %d errors != %d", completed, erred, n)
	}
	if st := healthStatus(t, s.router.URL); st != http.StatusOK {
		t.Fatalf("/health %d with one node up", st)
	}
}

// max_tokens beyond what the context leaves: 400 with the numbers, in
// vLLM's words; created is the request's time, not the router's start.
func TestContextLimitAndCreated(t *testing.T) {
	s := newStack(t, stackOpts{})
	prompt, _ := s.tok.Encode(testPrompt, true)
	resp := s.post(t, "/v1/completions", map[string]any{"prompt": testPrompt, "max_tokens": 250})
	msg := checkError(t, resp, http.StatusBadRequest, "max_tokens", "")
	wantMsg := fmt.Sprintf("'max_tokens' or 'max_completion_tokens' is too large: 250. This model's maximum context length is 256 tokens and your request has %d input tokens (250 > 256 - %d).", len(prompt), len(prompt))
	if msg != wantMsg {
		t.Fatalf("message %q\nwant    %q", msg, wantMsg)
	}
	if b, _ := s.rt.gate.busy(); b != 0 {
		t.Fatalf("%d slots busy after the refusal", b)
	}
	time.Sleep(1100 * time.Millisecond) // the router started in an earlier second
	before := time.Now().Unix()
	c := readJSON(t, s.post(t, "/v1/completions", map[string]any{"prompt": testPrompt, "max_tokens": 2}), false)
	var m struct {
		Created int64 `json:"created"`
	}
	if err := json.Unmarshal([]byte(c.raw[0]), &m); err != nil {
		t.Fatal(err)
	}
	if m.Created < before || m.Created > time.Now().Unix() {
		t.Fatalf("created %d, want the request's time (>= %d)", m.Created, before)
	}
}
