package router

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/tilert-go/tilert/api/decodeapi"
	"github.com/tilert-go/tilert/openai"
)

// onPost is a stackOpts.vllmWrap that numbers the prefills reaching vLLM
// (1, 2, ... in arrival order) and calls f with each; f answers the request
// itself by returning true, else vLLM does.
func onPost(f func(k int, ctx *fasthttp.RequestCtx) bool) func(fasthttp.RequestHandler) fasthttp.RequestHandler {
	var mu sync.Mutex
	posts := 0
	return func(inner fasthttp.RequestHandler) fasthttp.RequestHandler {
		return func(ctx *fasthttp.RequestCtx) {
			if ctx.IsPost() {
				mu.Lock()
				posts++
				k := posts
				mu.Unlock()
				if f(k, ctx) {
					return
				}
			}
			inner(ctx)
		}
	}
}

// slotWatch counts the generations holding decode state, seen from
// outside the router: +1 when a prefill reaches vLLM (the router holds the
// generation's slot by then), -1 when the decode node's final line passes
// on its way to the router (before the router can free the slot). Its
// high-water mark can only exceed the pool's slots if the router runs
// more generations at once than it holds slots for.
type slotWatch struct {
	mu               sync.Mutex
	cur, max, decode int
}

func (w *slotWatch) add(d int) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.cur += d
	w.max = max(w.max, w.cur)
	if d < 0 {
		w.decode++
	}
}

func (w *slotWatch) read() (high, decodes int) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.max, w.decode
}

// prefills wraps dev-vllm so that each prefill counts on w.
func (w *slotWatch) prefills(inner fasthttp.RequestHandler) fasthttp.RequestHandler {
	return func(ctx *fasthttp.RequestCtx) {
		if ctx.IsPost() {
			w.add(1)
		}
		inner(ctx)
	}
}

// nodeTap is an HTTP proxy in front of each decode node's http port (its
// hook rewrites Options.Nodes): /pd/decode streams pass line by line, final
// calling final (when set) before the line goes on; /pd/cancel is seen by
// rid. Once armed, each decode stream in flight stops before its next line
// (its rid sent on frozen) until a /pd/cancel for its rid passes; past
// a bound that only keeps a broken router from hanging the test, it goes
// on, recorded as not cancelled.
type nodeTap struct {
	final  func()
	frozen chan string

	mu          sync.Mutex
	armed       bool
	cancelled   map[string]chan struct{} // closed when the rid's cancel passed
	uncancelled []string                 // frozen streams that went on without their cancel
}

func newNodeTap() *nodeTap {
	return &nodeTap{frozen: make(chan string, 64), cancelled: map[string]chan struct{}{}}
}

func (p *nodeTap) arm(on bool) {
	p.mu.Lock()
	p.armed = on
	p.mu.Unlock()
}

// cancelOf is the channel closed when rid's cancel passes.
func (p *nodeTap) cancelOf(rid string) chan struct{} {
	p.mu.Lock()
	defer p.mu.Unlock()
	ch, ok := p.cancelled[rid]
	if !ok {
		ch = make(chan struct{})
		p.cancelled[rid] = ch
	}
	return ch
}

// hold stops a stream of rid while the tap is armed, once per stream.
func (p *nodeTap) hold(rid string) {
	p.mu.Lock()
	armed := p.armed
	p.mu.Unlock()
	if !armed {
		return
	}
	ch := p.cancelOf(rid)
	p.frozen <- rid
	select {
	case <-ch:
	case <-time.After(10 * time.Second): // a bound on a hang, not a timing assertion
		p.mu.Lock()
		p.uncancelled = append(p.uncancelled, rid)
		p.mu.Unlock()
	}
}

// thaw disarms the tap and lets every held stream go on.
func (p *nodeTap) thaw() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.armed = false
	for _, ch := range p.cancelled {
		select {
		case <-ch:
		default:
			close(ch)
		}
	}
}

func (p *nodeTap) notCancelled() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]string(nil), p.uncancelled...)
}

func (p *nodeTap) proxy(t *testing.T) func(*Options) {
	return func(o *Options) {
		for i, spec := range o.Nodes {
			k := strings.LastIndexByte(spec, ':')
			target := "127.0.0.1:" + spec[k+1:]
			rp := httputil.NewSingleHostReverseProxy(&url.URL{Scheme: "http", Host: target})
			srv := httptest.NewServer(http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
				if r.URL.Path == decodeapi.PathCancel {
					b, _ := io.ReadAll(r.Body)
					r.Body = io.NopCloser(bytes.NewReader(b))
					var c decodeapi.CancelRequest
					_ = json.Unmarshal(b, &c)
					rp.ServeHTTP(rw, r)
					ch := p.cancelOf(c.RID)
					p.mu.Lock()
					select {
					case <-ch:
					default:
						close(ch)
					}
					p.mu.Unlock()
					return
				}
				if r.URL.Path != decodeapi.PathDecode {
					rp.ServeHTTP(rw, r)
					return
				}
				b, _ := io.ReadAll(r.Body)
				var d decodeapi.DecodeRequest
				_ = json.Unmarshal(b, &d)
				out, err := http.NewRequestWithContext(r.Context(), r.Method, "http://"+target+r.URL.RequestURI(), bytes.NewReader(b))
				if err != nil {
					http.Error(rw, err.Error(), http.StatusBadGateway)
					return
				}
				out.Header = r.Header.Clone()
				resp, err := http.DefaultTransport.RoundTrip(out)
				if err != nil {
					http.Error(rw, err.Error(), http.StatusBadGateway)
					return
				}
				defer resp.Body.Close()
				for k, v := range resp.Header {
					rw.Header()[k] = v
				}
				rw.WriteHeader(resp.StatusCode)
				br := bufio.NewReader(resp.Body)
				held := false
				for {
					line, err := br.ReadBytes('\n')
					if len(bytes.TrimSpace(line)) > 0 && resp.StatusCode == http.StatusOK {
						if !held {
							p.hold(d.RID)
							p.mu.Lock()
							held = p.armed
							p.mu.Unlock()
						}
						if l, perr := decodeapi.ParseLine(line); perr == nil && l.Final() && p.final != nil {
							p.final()
						}
					}
					_, _ = rw.Write(line)
					rw.(http.Flusher).Flush()
					if err != nil {
						return
					}
				}
			}))
			t.Cleanup(srv.Close)
			_, port, _ := net.SplitHostPort(srv.Listener.Addr().String())
			o.Nodes[i] = spec[:k+1] + port
		}
	}
}

// latch parks handlers until open (idempotent; tests also open it at
// cleanup, registered after the stack's, so a failed test leaves no
// handler parked for the servers' shutdown to wait on).
type latch struct {
	ch   chan struct{}
	once sync.Once
}

func newLatch() *latch { return &latch{ch: make(chan struct{})} }

func (l *latch) open() { l.once.Do(func() { close(l.ch) }) }

// waveAnswer reads an answer of several choices (readN) and checks its
// shape: one id; non-streamed, the choices in index order; streamed, the
// usage chunk (when asked for) then [DONE] last, nothing after.
func waveAnswer(t *testing.T, resp *http.Response, stream bool, gens int) nResult {
	t.Helper()
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	r := readN(t, &http.Response{StatusCode: resp.StatusCode, Status: resp.Status, Body: io.NopCloser(bytes.NewReader(b))}, stream)
	var events []string
	if stream {
		for _, line := range strings.Split(string(b), "\n") {
			if ev, ok := strings.CutPrefix(line, "data: "); ok {
				events = append(events, ev)
			}
		}
		if n := len(events); n < 2 || events[n-1] != "[DONE]" || !strings.Contains(events[n-2], `"choices":[]`) {
			t.Fatalf("the stream does not end with the usage chunk and [DONE]: %q", events[max(0, n-2):])
		}
		events = events[:len(events)-1]
	} else {
		events = []string{string(b)}
		var a struct {
			Choices []struct {
				Index int `json:"index"`
			} `json:"choices"`
		}
		if err := json.Unmarshal(b, &a); err != nil {
			t.Fatal(err)
		}
		for i, c := range a.Choices {
			if c.Index != i {
				t.Fatalf("choice %d of the answer has index %d: %s", i, c.Index, b)
			}
		}
	}
	ids := map[string]bool{}
	for _, ev := range events {
		var a struct {
			ID string `json:"id"`
		}
		if err := json.Unmarshal([]byte(ev), &a); err != nil {
			t.Fatal(err)
		}
		ids[a.ID] = true
	}
	if len(ids) != 1 {
		t.Fatalf("the answer has ids %v, want one", ids)
	}
	if len(r.text) != gens {
		t.Fatalf("%d choices, want %d: %+v", len(r.text), gens, r)
	}
	return r
}

// More generations than the pool's slots run in waves: served in full,
// streamed and not, for n, a completions batch and chat; choice j of prompt
// p (index p * n + j) equals a separate request of that prompt with seed +
// j; usage counts each prompt once; at most the pool's slots run at once,
// seen from vLLM and the decode node; every slot is free after.
func TestWavesServeAll(t *testing.T) {
	const slots, maxTokens, seed = 2, 6, 7
	w := &slotWatch{}
	tap := newNodeTap()
	tap.final = func() { w.add(-1) }
	s := newStack(t, stackOpts{maxInflight: slots, vllmWrap: w.prefills, router: tap.proxy(t)})
	p1, _ := s.tok.Encode("Tokens stream to users", true)
	ids1 := p1[1:]
	msgs := []any{map[string]any{"role": "user", "content": testPrompt}}
	sampling := func(extra map[string]any) map[string]any {
		b := map[string]any{"max_tokens": maxTokens, "temperature": 0.9, "top_p": 1, "top_k": 0, "ignore_eos": true}
		for k, v := range extra {
			b[k] = v
		}
		return b
	}
	for _, tc := range []struct {
		name    string
		path    string
		prompts []any // the batch (nil: one prompt, chat's messages)
		n       int
	}{
		{"n 5", "/v1/completions", []any{testPrompt}, 5},
		{"batch of 2 x n 3", "/v1/completions", []any{testPrompt, ids1}, 3},
		{"batch of 3 x n 1", "/v1/completions", []any{testPrompt, ids1, "Hello"}, 1},
		{"chat n 3", "/v1/chat/completions", nil, 3},
	} {
		// What separate requests give: prompt p with seed + j.
		want := map[int]string{}
		prompts := max(1, len(tc.prompts))
		var usage openai.Usage
		for p := range prompts {
			for j := range tc.n {
				one := sampling(map[string]any{"seed": seed + j})
				if tc.prompts == nil {
					one["messages"] = msgs
				} else {
					one["prompt"] = tc.prompts[p]
				}
				r := readN(t, s.post(t, tc.path, one), false)
				want[p*tc.n+j] = r.text[0]
				if j == 0 {
					usage.PromptTokens += r.usage.PromptTokens
				}
				usage.CompletionTokens += r.usage.CompletionTokens
			}
		}
		if tc.n > 1 && want[0] == want[1] {
			t.Fatalf("%s: seeds %d and %d gave one text: the test would prove nothing", tc.name, seed, seed+1)
		}
		gens := prompts * tc.n
		for _, stream := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s stream=%v", tc.name, stream), func(t *testing.T) {
				waves := `tilert_router_wave_requests_total{endpoint="` + endpoint(tc.path == "/v1/chat/completions") + `"}`
				w0 := metricValue(t, s.router.URL+"/metrics", waves)
				_, dec0 := w.read()
				body := sampling(map[string]any{"seed": seed, "n": tc.n, "stream": stream})
				if tc.prompts == nil {
					body["messages"] = msgs
				} else if len(tc.prompts) == 1 {
					body["prompt"] = tc.prompts[0]
				} else {
					body["prompt"] = tc.prompts
				}
				if stream {
					body["stream_options"] = map[string]any{"include_usage": true}
				}
				r := waveAnswer(t, s.post(t, tc.path, body), stream, gens)
				for i := range gens {
					if r.text[i] != want[i] || r.finish[i] != "length" {
						t.Errorf("choice %d: %q (%s), want the separate request's %q", i, r.text[i], r.finish[i], want[i])
					}
				}
				usage.TotalTokens = usage.PromptTokens + usage.CompletionTokens
				if r.usage == nil || *r.usage != usage || r.usages != 1 {
					t.Errorf("usage %+v (%d times), want %+v once", r.usage, r.usages, usage)
				}
				if stream && r.done != 1 {
					t.Errorf("%d [DONE]", r.done)
				}
				high, dec := w.read()
				if high > slots || dec-dec0 != gens {
					t.Errorf("%d generations at once (pool of %d), %d decoded (want %d)", high, slots, dec-dec0, gens)
				}
				if w1 := metricValue(t, s.router.URL+"/metrics", waves); w1 != w0+1 {
					t.Errorf("wave requests %v -> %v, want one more", w0, w1)
				}
				if b, _ := s.rt.gate.busy(); b != 0 || s.rt.gate.queued() != 0 {
					t.Errorf("%d slots busy, %d queued after the answer", b, s.rt.gate.queued())
				}
			})
		}
	}
	// n up to the pool's slots keeps the gang path: no wave.
	w0 := metricValue(t, s.router.URL+"/metrics", `tilert_router_wave_requests_total{endpoint="completions"}`)
	r := readN(t, s.post(t, "/v1/completions", sampling(map[string]any{"prompt": testPrompt, "n": slots, "seed": seed})), false)
	if len(r.text) != slots {
		t.Fatalf("n=%d: %+v", slots, r)
	}
	if w1 := metricValue(t, s.router.URL+"/metrics", `tilert_router_wave_requests_total{endpoint="completions"}`); w1 != w0 {
		t.Errorf("n=%d on %d slots went in waves (%v -> %v)", slots, slots, w0, w1)
	}
}

// A choice that cannot start (its prefill fails), in the first wave or a
// later one, fails the request with its error (non-streamed: the status;
// streamed: an error event, then [DONE], no usage); the running choices
// are cancelled on the node (the tap holds a running choice's decode
// stream until its cancel passes, so the failure surely meets one
// running), every slot and node state is freed: the pool then serves a
// request of all its slots.
func TestWavesOneFails(t *testing.T) {
	const slots, n = 2, 5
	for _, tc := range []struct {
		name   string
		fail   int // the prefill that fails (1: choice 0, admitted before the answer)
		stream bool
	}{
		{"first choice", 1, false},
		{"first choice streamed", 1, true}, // before the answer starts: a status
		{"first wave", 2, false},
		{"later wave", 4, false},
		{"first wave streamed", 2, true},
		{"later wave streamed", 4, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var mu sync.Mutex
			froze := ""
			tap := newNodeTap()
			s := newStack(t, stackOpts{maxInflight: slots, router: tap.proxy(t), vllmWrap: onPost(func(k int, ctx *fasthttp.RequestCtx) bool {
				if k != tc.fail {
					return false
				}
				if k > 1 { // fail while another choice is surely decoding
					tap.arm(true)
					select {
					case rid := <-tap.frozen:
						mu.Lock()
						froze = rid
						mu.Unlock()
					case <-time.After(10 * time.Second): // bounds a hang
					}
				}
				ctx.SetStatusCode(http.StatusInternalServerError)
				ctx.SetBodyString(`{"error":{"message":"boom","type":"InternalServerError","code":500}}`)
				return true
			})})
			body := map[string]any{"prompt": testPrompt, "max_tokens": 6, "n": n, "ignore_eos": true, "stream": tc.stream}
			if tc.stream {
				body["stream_options"] = map[string]any{"include_usage": true}
			}
			resp := s.post(t, "/v1/completions", body)
			if !tc.stream || tc.fail == 1 {
				if !strings.Contains(checkError(t, resp, http.StatusBadGateway, "", "prefill_failed"), "boom") {
					t.Error("the error is not the failed prefill's")
				}
			} else {
				b, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				if resp.StatusCode != http.StatusOK {
					t.Fatalf("%s: %s", resp.Status, b)
				}
				var errs, usages, done int
				var last string
				for _, line := range strings.Split(string(b), "\n") {
					ev, ok := strings.CutPrefix(line, "data: ")
					if !ok {
						continue
					}
					last = ev
					switch {
					case ev == "[DONE]":
						done++
					case strings.HasPrefix(ev, `{"error":`):
						errs++
						if !strings.Contains(ev, "boom") || !strings.Contains(ev, "prefill_failed") {
							t.Errorf("error event %s", ev)
						}
					case strings.Contains(ev, `"usage":{`):
						usages++
					}
				}
				if errs != 1 || usages != 0 || done != 1 || last != "[DONE]" {
					t.Errorf("%d error events, %d usage chunks, %d [DONE], last %q:\n%s", errs, usages, done, last, b)
				}
			}
			// The answer comes after every choice has ended: nothing is held.
			if b, _ := s.rt.gate.busy(); b != 0 || s.rt.gate.queued() != 0 {
				t.Errorf("%d slots busy, %d queued after the failed request", b, s.rt.gate.queued())
			}
			mu.Lock()
			running := froze
			mu.Unlock()
			if tc.fail > 1 && running == "" {
				t.Error("no choice was decoding when the prefill failed: the test proves nothing")
			}
			if nc := tap.notCancelled(); len(nc) > 0 {
				t.Errorf("running choices %v were not cancelled on the node", nc)
			}
			tap.arm(false)
			r := readN(t, s.post(t, "/v1/completions", map[string]any{"prompt": testPrompt, "max_tokens": 4, "n": slots, "temperature": 0}), false)
			if len(r.text) != slots {
				t.Fatalf("after the failure: %+v", r)
			}
		})
	}
}

// A client that leaves mid-wave (a second-wave choice's prefill under way,
// another choice decoding, held there by the tap) cancels the request:
// every choice ends, the decoding one is cancelled on the node, every slot
// is free, the request counts as cancelled, and the node has no state left
// (the pool serves a request of all its slots).
func TestWavesClientCancel(t *testing.T) {
	const slots, n = 2, 6
	for _, stream := range []bool{false, true} {
		t.Run(fmt.Sprintf("stream=%v", stream), func(t *testing.T) {
			parked, release := make(chan struct{}), newLatch()
			tap := newNodeTap()
			s := newStack(t, stackOpts{maxInflight: slots, router: tap.proxy(t), vllmWrap: onPost(func(k int, ctx *fasthttp.RequestCtx) bool {
				if k != slots+1 { // the first choice of the second wave
					return false
				}
				tap.arm(true)
				close(parked)
				<-release.ch
				ctx.SetStatusCode(http.StatusInternalServerError) // as vLLM aborting a request its client left
				ctx.SetBodyString(`{"error":{"message":"aborted","type":"InternalServerError","code":500}}`)
				return true
			})})
			t.Cleanup(release.open)
			b, _ := json.Marshal(map[string]any{"prompt": testPrompt, "max_tokens": 8, "n": n, "ignore_eos": true, "stream": stream})
			cctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			req, _ := http.NewRequestWithContext(cctx, http.MethodPost, s.router.URL+"/v1/completions", bytes.NewReader(b))
			req.Header.Set("Content-Type", "application/json")
			errc := make(chan error, 1)
			go func() {
				resp, err := http.DefaultClient.Do(req)
				if err == nil {
					_, err = io.ReadAll(resp.Body)
					resp.Body.Close()
				}
				errc <- err
			}()
			<-parked
			// Another choice decodes (the one still running from the first
			// wave, or the next one once that has ended), held by the tap.
			select {
			case <-tap.frozen:
			case <-time.After(10 * time.Second): // bounds a hang
				t.Fatal("no other choice decoded while the second wave's prefill waited")
			}
			cancel()
			if err := <-errc; err == nil {
				t.Fatal("the cancelled client got a whole answer")
			}
			series := `tilert_router_requests_total{endpoint="completions",outcome="cancelled"}`
			eventually(t, "the request counted as cancelled", func() bool { return metricValue(t, s.router.URL+"/metrics", series) == 1 })
			// Counted once every choice has ended: nothing is held.
			if b, _ := s.rt.gate.busy(); b != 0 || s.rt.gate.queued() != 0 {
				t.Errorf("%d slots busy, %d queued after the client left", b, s.rt.gate.queued())
			}
			if nc := tap.notCancelled(); len(nc) > 0 {
				t.Errorf("running choices %v were not cancelled on the node", nc)
			}
			tap.arm(false)
			release.open()
			r := readN(t, s.post(t, "/v1/completions", map[string]any{"prompt": testPrompt, "max_tokens": 4, "n": slots, "temperature": 0}), false)
			if len(r.text) != slots {
				t.Fatalf("after the cancel: %+v", r)
			}
		})
	}
}

// Wave requests, gang requests and single requests at once on one pool
// all complete: a wave never holds a slot while it waits for another, so
// nothing deadlocks.
func TestWavesBesideOthers(t *testing.T) {
	const slots = 2
	s := newStack(t, stackOpts{maxInflight: slots, queueSize: 16})
	bodies := []map[string]any{
		{"n": 5}, {"n": 2}, {"n": 1}, {"n": 4, "stream": true}, {"n": 2, "stream": true}, {"n": 3}, {"n": 1, "stream": true},
	}
	var wg sync.WaitGroup
	resps := make([]*http.Response, len(bodies))
	for i, b := range bodies {
		b["prompt"], b["max_tokens"], b["temperature"], b["ignore_eos"] = testPrompt, 6, 0, true
		if b["stream"] == true {
			b["stream_options"] = map[string]any{"include_usage": true}
		}
		wg.Add(1)
		go func() { // the answers are read below, on the test's goroutine
			defer wg.Done()
			resps[i] = s.post(t, "/v1/completions", b)
		}()
	}
	wg.Wait()
	for i, resp := range resps {
		stream, _ := bodies[i]["stream"].(bool)
		n := bodies[i]["n"].(int)
		r := waveAnswer(t, resp, stream, n)
		for j := range n {
			if r.text[j] != r.text[0] || r.finish[j] != "length" {
				t.Errorf("request %d (n=%d) choice %d: %q %s, want %q (greedy)", i, n, j, r.text[j], r.finish[j], r.text[0])
			}
		}
	}
	if b, _ := s.rt.gate.busy(); b != 0 {
		t.Errorf("%d slots busy after the requests", b)
	}
}

// A later choice that gets no slot (the queue is full: another request
// holds the pool's other slot, choice 0 the last one, held by the tap if it
// gets to decode) fails the request: non-streamed with the gate's 429,
// streamed with that error as an event then [DONE]; choice 0 is cancelled
// on the node, its slot freed, and the other request is untouched.
func TestWavesAcquireFails(t *testing.T) {
	const slots = 2
	for _, stream := range []bool{false, true} {
		t.Run(fmt.Sprintf("stream=%v", stream), func(t *testing.T) {
			parked, release := make(chan struct{}), newLatch()
			tap := newNodeTap()
			s := newStack(t, stackOpts{maxInflight: slots, router: tap.proxy(t), vllmWrap: onPost(func(k int, ctx *fasthttp.RequestCtx) bool {
				if k == 1 { // the other request, parked in its prefill on a slot
					close(parked)
					<-release.ch
				}
				return false
			})})
			t.Cleanup(release.open)
			other := make(chan *http.Response, 1)
			go func() {
				other <- s.post(t, "/v1/completions", map[string]any{"prompt": testPrompt, "max_tokens": 4, "temperature": 0})
			}()
			<-parked
			tap.arm(true) // choice 0 keeps its slot, decoding, until cancelled
			resp := s.post(t, "/v1/completions", map[string]any{"prompt": testPrompt, "max_tokens": 4, "n": 3, "stream": stream})
			if !stream {
				checkError(t, resp, http.StatusTooManyRequests, "", "queue_full")
			} else {
				b, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				evs := []string{}
				for _, line := range strings.Split(string(b), "\n") {
					if ev, ok := strings.CutPrefix(line, "data: "); ok {
						evs = append(evs, ev)
					}
				}
				n := len(evs)
				if resp.StatusCode != http.StatusOK || n < 2 || evs[n-1] != "[DONE]" || !strings.Contains(evs[n-2], `"code":"queue_full"`) {
					t.Fatalf("%s: %s", resp.Status, b)
				}
			}
			if nc := tap.notCancelled(); len(nc) > 0 {
				t.Errorf("choice 0 (%v) was not cancelled on the node", nc)
			}
			tap.arm(false)
			if b, _ := s.rt.gate.busy(); b != 1 {
				t.Errorf("%d slots busy after the failed request, want the other request's 1", b)
			}
			release.open()
			if c := readJSON(t, <-other, false); c.finish != "length" {
				t.Errorf("the other request: %+v", c)
			}
			if b, _ := s.rt.gate.busy(); b != 0 {
				t.Errorf("%d slots busy at the end", b)
			}
			// Choice 0's state is gone from the node: both its slots serve.
			r := readN(t, s.post(t, "/v1/completions", map[string]any{"prompt": testPrompt, "max_tokens": 4, "n": slots, "temperature": 0}), false)
			if len(r.text) != slots {
				t.Fatalf("after the failure: %+v", r)
			}
		})
	}
}

// A later choice's queue deadline runs from when it starts waiting for a
// slot, not from the request's arrival: a request older than
// --queue-timeout whose next choice must queue behind another request
// still completes. (Choice 0 is held decoding and choice 1 in its prefill
// past the timeout; a single request then queues and takes choice 0's slot
// when it ends, held in its prefill while choice 2 waits in the queue.)
func TestWavesDeadlinePerChoice(t *testing.T) {
	const slots, timeout = 2, 3 * time.Second
	parked, release := make(chan struct{}), newLatch()
	otherParked, otherRelease := make(chan struct{}), newLatch()
	tap := newNodeTap()
	s := newStack(t, stackOpts{maxInflight: slots, queueSize: 4, queueTimeout: timeout, router: tap.proxy(t),
		vllmWrap: onPost(func(k int, ctx *fasthttp.RequestCtx) bool {
			switch k {
			case 2: // choice 1
				close(parked)
				<-release.ch
			case 3: // the other request, on choice 0's slot
				close(otherParked)
				<-otherRelease.ch
			}
			return false
		})})
	t.Cleanup(release.open)
	t.Cleanup(otherRelease.open)
	tap.arm(true)
	t0 := time.Now()
	wave := make(chan *http.Response, 1)
	go func() {
		wave <- s.post(t, "/v1/completions", map[string]any{"prompt": testPrompt, "max_tokens": 4, "n": 3, "temperature": 0})
	}()
	<-tap.frozen // choice 0 decodes, held
	<-parked     // choice 1 in its prefill: both slots taken
	// The request outlives its queue timeout (a precondition, not a
	// measurement: a t0-based deadline would have run out by now).
	time.Sleep(timeout - time.Since(t0) + 100*time.Millisecond)
	other := make(chan *http.Response, 1)
	go func() {
		other <- s.post(t, "/v1/completions", map[string]any{"prompt": testPrompt, "max_tokens": 4, "temperature": 0})
	}()
	eventually(t, "the other request queued", func() bool { return s.rt.gate.queued() == 1 })
	tap.thaw() // choice 0 ends; its slot goes to the other request, choice 2 queues
	<-otherParked
	eventually(t, "choice 2 queued", func() bool { return s.rt.gate.queued() == 1 })
	otherRelease.open() // its slot then goes to choice 2
	if c := readJSON(t, <-other, false); c.finish != "length" {
		t.Fatalf("the other request: %+v", c)
	}
	release.open()
	r := waveAnswer(t, <-wave, false, 3)
	if r.text[0] != r.text[1] || r.text[1] != r.text[2] {
		t.Errorf("greedy choices differ: %+v", r)
	}
	if b, _ := s.rt.gate.busy(); b != 0 {
		t.Errorf("%d slots busy at the end", b)
	}
}
