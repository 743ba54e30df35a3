package router

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"runtime"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/tilert-go/tilert/api/decodeapi"
	"github.com/tilert-go/tilert/tokenizer"
)

// The load test and the benchmarks isolate the router: its upstreams are
// harness servers that speak the real protocols (vLLM's prefill answer
// with "token_id:N", a decode node's decodeapi endpoints) at a speed the
// test sets, so what is measured is the router.

// harnessNode is a decode node's HTTP side: capacity slots, tokens
// streamed one line each, every gap apart; sent[i] records when token i of
// the current stream went out (for the latency benchmark).
type harnessNode struct {
	slots  int
	tokens int
	gap    time.Duration
	mu     sync.Mutex
	sent   map[string][]time.Time
	busy   atomic.Int64
	addr   string
}

func startHarnessNode(t testing.TB, slots, tokens int, gap time.Duration) *harnessNode {
	n := &harnessNode{slots: slots, tokens: tokens, gap: gap, sent: map[string][]time.Time{}}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	n.addr = ln.Addr().String()
	srv := &fasthttp.Server{Handler: n.handle, MaxIdleWorkerDuration: 50 * time.Millisecond}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Shutdown() })
	return n
}

func (n *harnessNode) handle(c *fasthttp.RequestCtx) {
	switch string(c.Path()) {
	case decodeapi.PathCapabilities:
		writeJSON(c, 200, decodeapi.Capabilities{MaxInflight: n.slots, MaxSeqLen: 1 << 16, VocabSize: 1 << 20})
	case decodeapi.PathHealth:
		writeJSON(c, 200, decodeapi.Health{Status: "ok"})
	case decodeapi.PathCancel:
		writeJSON(c, 200, decodeapi.CancelResponse{Cancelled: true})
	case decodeapi.PathDecode:
		var req decodeapi.DecodeRequest
		if json.Unmarshal(c.PostBody(), &req) != nil {
			c.SetStatusCode(400)
			return
		}
		if n.busy.Add(1) > int64(n.slots) {
			n.busy.Add(-1)
			writeJSON(c, 429, decodeapi.ErrorBody{Error: decodeapi.CodeBusy, Message: "over capacity"})
			return
		}
		want := n.tokens
		if req.MaxTokens > 0 {
			want = min(want, req.MaxTokens)
		}
		c.SetContentType(decodeapi.ContentTypeNDJSON)
		c.SetBodyStreamWriter(func(w *bufio.Writer) {
			release := sync.OnceFunc(func() { n.busy.Add(-1) })
			defer release()
			times := make([]time.Time, 0, want)
			for i := 1; i < want; i++ { // the first token came from prefill
				if n.gap > 0 {
					time.Sleep(n.gap)
				}
				b, _ := json.Marshal(decodeapi.TokensLine{T: []int{100 + i%50}})
				times = append(times, time.Now())
				_, _ = w.Write(append(b, '\n'))
				if w.Flush() != nil {
					return
				}
			}
			n.mu.Lock()
			n.sent[req.RID] = times
			n.mu.Unlock()
			// As the decode node does (roles/decode sched.go finish): the
			// slot is free before the final line goes out, so a router that
			// reads the line may hand the capacity on at once. Freed after
			// the flush, a loaded machine saw the next request refused as
			// busy (TestLoad1000Streams: 200s with only the prefill token).
			release()
			b, _ := json.Marshal(decodeapi.FinalLine{Done: true, N: want, FinishReason: decodeapi.FinishLength})
			_, _ = w.Write(append(b, '\n'))
			_ = w.Flush()
		})
	default:
		c.SetStatusCode(404)
	}
}

// harnessVLLM answers prefill calls at once with token 100.
func startHarnessVLLM(t testing.TB) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &fasthttp.Server{Handler: func(c *fasthttp.RequestCtx) {
		if string(c.Method()) == "GET" {
			c.SetBodyString(`{"object":"list","data":[{"id":"glm-5-tiny"}]}`)
			return
		}
		c.SetContentType("application/json")
		c.SetBodyString(`{"choices":[{"index":0,"text":"x","finish_reason":"length","logprobs":{"tokens":["token_id:100"]}}],"usage":{"prompt_tokens":3}}`)
	}, MaxIdleWorkerDuration: 50 * time.Millisecond}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Shutdown() })
	return "http://" + ln.Addr().String()
}

// harnessRouter is a router over one harness node.
func harnessRouter(t testing.TB, n *harnessNode, queue int, qt time.Duration) (*Router, *testServer) {
	_, port, _ := net.SplitHostPort(n.addr)
	tok, err := loadTok(t)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	rt, err := New(ctx, Options{VLLMURL: startHarnessVLLM(t), Nodes: []string{"127.0.0.1:1:" + port}, Tokenizer: tok,
		ServedModel: "glm-5-tiny", QueueSize: queue, QueueTimeout: qt, Log: quietLog()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(rt.Close)
	return rt, serveRouter(t, rt)
}

// loadTok is the tiny model's tokenizer (the router detokenises).
func loadTok(t testing.TB) (*tokenizer.Tokenizer, error) { return tokenizer.Load(tinyModel(t)) }

// streamOnce runs one streamed completion; it returns the status, the
// Retry-After header, and the times the token chunks arrived.
func streamOnce(client *http.Client, url string, maxTokens int) (int, string, []time.Time, error) {
	body := fmt.Sprintf(`{"prompt":"hi","max_tokens":%d,"stream":true,"temperature":0}`, maxTokens)
	resp, err := client.Post(url+"/v1/completions", "application/json", strings.NewReader(body))
	if err != nil {
		return 0, "", nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		_, _ = io.Copy(io.Discard, resp.Body)
		return resp.StatusCode, resp.Header.Get("Retry-After"), nil, nil
	}
	var got []time.Time
	br := bufio.NewReader(resp.Body)
	done := false
	for {
		line, err := br.ReadString('\n')
		if strings.HasPrefix(line, "data: ") {
			if strings.HasPrefix(line, "data: [DONE]") {
				done = true
			} else if strings.Contains(line, `"text"`) && !strings.Contains(line, `"finish_reason":"`) {
				got = append(got, time.Now())
			}
		}
		if err != nil {
			break
		}
	}
	if !done {
		return resp.StatusCode, "", got, fmt.Errorf("stream ended without [DONE]")
	}
	return resp.StatusCode, "", got, nil
}

// 1000 concurrent streaming clients against capacity 4: every request
// completes or gets 429 with Retry-After, none hangs (each has a deadline),
// and three rounds leave the router's goroutines and heap where the first
// left them (bounded memory).
func TestLoad1000Streams(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: skipping the 1000-client load test")
	}
	n := startHarnessNode(t, 4, 16, time.Millisecond)
	_, srv := harnessRouter(t, n, 64, 300*time.Millisecond)
	client := &http.Client{Timeout: time.Minute, Transport: &http.Transport{MaxIdleConnsPerHost: 1000, MaxConnsPerHost: 0}}
	heap := func() uint64 {
		runtime.GC()
		var m runtime.MemStats
		runtime.ReadMemStats(&m)
		return m.HeapInuse
	}
	var heaps []uint64
	var goroutines []int
	for round := 0; round < 3; round++ {
		const clients = 1000
		var ok, rejected, bad atomic.Int64
		var wg sync.WaitGroup
		for range clients {
			wg.Add(1)
			go func() {
				defer wg.Done()
				st, retry, toks, err := streamOnce(client, srv.URL, 16)
				switch {
				case err == nil && st == http.StatusOK && len(toks) == 16:
					ok.Add(1)
				case err == nil && st == http.StatusTooManyRequests && retry != "":
					rejected.Add(1)
				default:
					bad.Add(1)
					t.Errorf("status %d retry %q tokens %d err %v", st, retry, len(toks), err)
				}
			}()
		}
		wg.Wait()
		client.CloseIdleConnections()
		t.Logf("round %d: %d completed, %d got 429 with Retry-After, %d other", round, ok.Load(), rejected.Load(), bad.Load())
		if ok.Load()+rejected.Load() != clients || ok.Load() == 0 {
			t.Fatalf("round %d: %d + %d != %d", round, ok.Load(), rejected.Load(), clients)
		}
		goroutines = append(goroutines, settledGoroutines(5*time.Second))
		heaps = append(heaps, heap())
	}
	t.Logf("heap in use after each round: %v; goroutines: %v", heaps, goroutines)
	if heaps[2] > heaps[0]+16<<20 {
		t.Fatalf("heap grew from %d to %d over the rounds", heaps[0], heaps[2])
	}
	if goroutines[2] > goroutines[0]+50 {
		t.Fatalf("goroutines grew from %d to %d over the rounds", goroutines[0], goroutines[2])
	}
}

// settledGoroutines waits (at most max) for the connections of a round to
// wind down, i.e. for the goroutine count to hold for 200 ms, and returns
// it. A fixed pause was too short on a loaded machine (a CI run read 51
// goroutines more after the third round than after the first); a leak
// still shows, since leaked goroutines do not wind down.
func settledGoroutines(max time.Duration) int {
	n, held := runtime.NumGoroutine(), 0
	for end := time.Now().Add(max); time.Now().Before(end) && held < 4; {
		time.Sleep(50 * time.Millisecond)
		if m := runtime.NumGoroutine(); m == n {
			held++
		} else {
			n, held = m, 0
		}
	}
	return n
}

// BenchmarkRouterTokenLatency: one stream at a time through the router;
// the harness node records when it sent each token, the client when the
// matching SSE chunk arrived. us/token-added is the median of the
// difference: the router's work per token (parse the NDJSON line,
// detokenise, build and flush the SSE chunk) plus two loopback hops.
func BenchmarkRouterTokenLatency(b *testing.B) {
	const tokens = 64
	n := startHarnessNode(b, 4, tokens, 200*time.Microsecond)
	_, srv := harnessRouter(b, n, 4, time.Second)
	client := &http.Client{}
	var lat []float64
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		before := map[string]bool{}
		n.mu.Lock()
		for k := range n.sent {
			before[k] = true
		}
		n.mu.Unlock()
		st, _, got, err := streamOnce(client, srv.URL, tokens)
		if err != nil || st != 200 {
			b.Fatalf("status %d: %v", st, err)
		}
		n.mu.Lock()
		var sent []time.Time
		for k, v := range n.sent {
			if !before[k] {
				sent = v
			}
		}
		n.mu.Unlock()
		// got[0] is the prefill's token; got[1:] match sent.
		if len(got) != len(sent)+1 {
			b.Fatalf("%d chunks for %d sent tokens", len(got), len(sent))
		}
		for j, s := range sent {
			lat = append(lat, float64(got[j+1].Sub(s).Microseconds()))
		}
	}
	b.StopTimer()
	sort.Float64s(lat)
	b.ReportMetric(lat[len(lat)/2], "us/token-added")
	b.ReportMetric(lat[len(lat)*99/100], "p99-us/token-added")
}

// BenchmarkRouter429: capacity 4 held by slow streams, no queue: how many
// 429s (with Retry-After) the router answers per second under 64
// concurrent callers.
func BenchmarkRouter429(b *testing.B) {
	n := startHarnessNode(b, 4, 1<<20, 10*time.Millisecond)
	_, srv := harnessRouter(b, n, 0, time.Second)
	hold := &http.Client{}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	for range 4 { // fill the 4 slots with streams that last the benchmark
		go func() {
			req, _ := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL+"/v1/completions",
				strings.NewReader(`{"prompt":"hi","max_tokens":60000,"stream":true}`))
			if resp, err := hold.Do(req); err == nil {
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}
		}()
	}
	for i := 0; ; i++ {
		if b2, _ := srvBusy(srv); b2 == 4 {
			break
		}
		if i > 5000 {
			b.Fatal("the 4 slots never filled")
		}
		time.Sleep(time.Millisecond)
	}
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64}}
	var rejected, other atomic.Int64
	b.ReportAllocs()
	b.SetParallelism(64 / runtime.GOMAXPROCS(0))
	t0 := time.Now()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			resp, err := client.Post(srv.URL+"/v1/completions", "application/json", strings.NewReader(`{"prompt":"hi","max_tokens":4}`))
			if err != nil {
				other.Add(1)
				continue
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode == 429 && resp.Header.Get("Retry-After") != "" {
				rejected.Add(1)
			} else {
				other.Add(1)
			}
		}
	})
	b.StopTimer()
	if other.Load() > 0 {
		b.Fatalf("%d answers were not 429 with Retry-After", other.Load())
	}
	b.ReportMetric(float64(rejected.Load())/time.Since(t0).Seconds(), "429/s")
}

func srvBusy(srv *testServer) (int, error) {
	resp, err := http.Get(srv.URL + "/health")
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	var h Health
	err = json.NewDecoder(resp.Body).Decode(&h)
	return h.Busy, err
}
