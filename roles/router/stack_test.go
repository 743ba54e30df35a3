package router

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/tilert-go/tilert/api/decodeapi"
	"github.com/tilert-go/tilert/config"
	"github.com/tilert-go/tilert/engine"
	"github.com/tilert-go/tilert/engine/cpu"
	"github.com/tilert-go/tilert/internal/devprefill"
	"github.com/tilert-go/tilert/internal/devvllm"
	"github.com/tilert-go/tilert/internal/fastserve"
	"github.com/tilert-go/tilert/model"
	"github.com/tilert-go/tilert/model/synth"
	"github.com/tilert-go/tilert/openai"
	"github.com/tilert-go/tilert/rdma"
	"github.com/tilert-go/tilert/roles/decode"
	"github.com/tilert-go/tilert/tokenizer"
)

// The tiny synthetic model is written once for the package.
var (
	modelOnce sync.Once
	modelDir  string
	modelErr  error
)

func tinyModel(t testing.TB) string {
	t.Helper()
	modelOnce.Do(func() {
		d, err := os.MkdirTemp("", "tilert-router-test-")
		if err != nil {
			modelErr = err
			return
		}
		modelDir = filepath.Join(d, "glm-5-tiny")
		modelErr = synth.Write("glm-5-tiny", modelDir, 0, nil)
	})
	if modelErr != nil {
		t.Fatal(modelErr)
	}
	return modelDir
}

func TestMain(m *testing.M) {
	code := m.Run()
	if modelDir != "" {
		_ = os.RemoveAll(filepath.Dir(modelDir))
	}
	os.Exit(code)
}

// stack is a decode node (roles/decode, in process), the dev-vllm
// stand-in and a router, all on the tiny model.
type stack struct {
	dir     string
	tok     *tokenizer.Tokenizer
	node    decodeapi.Addrs
	nodes   []decodeapi.Addrs
	proxies [][2]*tcpProxy // http, ctrl proxies per node (stackOpts.proxy)
	vllm    *fastserve.Started
	router  *testServer
	rt      *Router
	hold    chan struct{} // when non-nil, prefill requests wait for a receive
	holding chan struct{} // a prefill request is waiting on hold
}

type stackOpts struct {
	maxInflight  int
	maxSeqLen    int
	queueSize    int
	queueTimeout time.Duration
	vllmURL      string // instead of dev-vllm
	hold         bool
	stateTimeout float64 // the node's state_timeout_s (default 30)
	nodes        int     // decode nodes (default 1)
	proxy        bool    // reach each node through a tcpProxy (to kill it)
	router       func(*Options)
	vllmWrap     func(fasthttp.RequestHandler) fasthttp.RequestHandler // around dev-vllm's handler
}

// startNode runs a decode node (roles/decode, in process) on the tiny model.
func startNode(t *testing.T, dir string, o stackOpts) decodeapi.Addrs {
	t.Helper()
	cfg := config.Default()
	cfg.Model.Name, cfg.Model.WeightsDir, cfg.Model.MaxSeqLen, cfg.Model.WithMTP = "glm5", dir, max(o.maxSeqLen, 256), true
	cfg.Decode.Device, cfg.Decode.Host, cfg.Decode.CtrlPort, cfg.Decode.HTTPPort = "cpu", "127.0.0.1", 0, 0
	cfg.Decode.MaxInflight = max(o.maxInflight, 1)
	if o.stateTimeout > 0 {
		cfg.Decode.StateTimeoutS = o.stateTimeout
	}
	cfg.Transfer.Listen = "127.0.0.1:0"
	addrFile := filepath.Join(t.TempDir(), "addr.json")
	ctx, stop := context.WithCancel(context.Background())
	runErr := make(chan error, 1)
	go func() { runErr <- decode.Run(ctx, cfg, addrFile) }()
	t.Cleanup(func() {
		stop()
		if err := <-runErr; err != nil {
			t.Errorf("decode.Run: %v", err)
		}
	})
	var addrs decodeapi.Addrs
	for i := 0; ; i++ {
		b, err := os.ReadFile(addrFile)
		if err == nil && json.Unmarshal(b, &addrs) == nil {
			return addrs
		}
		if i > 4000 {
			t.Fatal("the decode node did not write its address file")
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// tcpProxy forwards a port to a target; kill drops every connection and
// refuses new ones (the node looks dead from the router's side: a crash
// or a cut cable), revive listens again on the same port.
type tcpProxy struct {
	t      testing.TB
	addr   string
	target string
	mu     sync.Mutex
	ln     net.Listener
	conns  map[net.Conn]bool
}

func newTCPProxy(t testing.TB, target string) *tcpProxy {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &tcpProxy{t: t, addr: ln.Addr().String(), target: target, conns: map[net.Conn]bool{}}
	p.serve(ln)
	t.Cleanup(p.kill)
	return p
}

func (p *tcpProxy) serve(ln net.Listener) {
	p.mu.Lock()
	p.ln = ln
	p.mu.Unlock()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			u, err := net.Dial("tcp", p.target)
			if err != nil {
				c.Close()
				continue
			}
			p.mu.Lock()
			if p.ln != ln {
				p.mu.Unlock()
				c.Close()
				u.Close()
				return
			}
			p.conns[c], p.conns[u] = true, true
			p.mu.Unlock()
			go func() { _, _ = io.Copy(u, c); u.Close(); c.Close() }()
			go func() { _, _ = io.Copy(c, u); u.Close(); c.Close() }()
		}
	}()
}

func (p *tcpProxy) kill() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.ln != nil {
		p.ln.Close()
		p.ln = nil
	}
	for c := range p.conns {
		c.Close()
	}
	p.conns = map[net.Conn]bool{}
}

func (p *tcpProxy) revive() {
	var ln net.Listener
	var err error
	for i := 0; i < 100; i++ {
		if ln, err = net.Listen("tcp", p.addr); err == nil {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err != nil {
		p.t.Errorf("revive %s: %v", p.addr, err)
		return
	}
	p.serve(ln)
}

func newStack(t *testing.T, o stackOpts) *stack {
	t.Helper()
	dir := tinyModel(t)
	s := &stack{dir: dir}
	var err error
	if s.tok, err = tokenizer.Load(dir); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < max(o.nodes, 1); i++ {
		addrs := startNode(t, dir, o)
		if i == 0 {
			s.node = addrs
		}
		s.nodes = append(s.nodes, addrs)
	}

	vllmURL := o.vllmURL
	if vllmURL == "" {
		hs, closeVLLM := devVLLMServer(t, dir, s.tok)
		if o.hold {
			s.hold, s.holding = make(chan struct{}), make(chan struct{}, 16)
			inner := hs.Handler
			hs.Handler = func(ctx *fasthttp.RequestCtx) {
				if ctx.IsPost() {
					s.holding <- struct{}{}
					<-s.hold
				}
				inner(ctx)
			}
		}
		if o.vllmWrap != nil {
			hs.Handler = o.vllmWrap(hs.Handler)
		}
		if s.vllm, err = fastserve.Start(hs, "127.0.0.1:0"); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			if s.hold != nil {
				close(s.hold)
			}
			s.vllm.Close()
			closeVLLM()
		})
		vllmURL = s.vllm.URL
	}
	var specs []string
	for _, addrs := range s.nodes {
		host, httpPort, _ := net.SplitHostPort(addrs.HTTP)
		_, ctrlPort, _ := net.SplitHostPort(addrs.Ctrl)
		if o.proxy {
			hp, cp := newTCPProxy(t, addrs.HTTP), newTCPProxy(t, addrs.Ctrl)
			s.proxies = append(s.proxies, [2]*tcpProxy{hp, cp})
			_, httpPort, _ = net.SplitHostPort(hp.addr)
			_, ctrlPort, _ = net.SplitHostPort(cp.addr)
		}
		specs = append(specs, host+":"+ctrlPort+":"+httpPort)
	}
	pctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	qt := o.queueTimeout
	if qt == 0 {
		qt = 30 * time.Second
	}
	ro := Options{VLLMURL: vllmURL, Nodes: specs, Tokenizer: s.tok, ModelPath: dir, QueueSize: o.queueSize, QueueTimeout: qt,
		HealthInterval: 50 * time.Millisecond, Log: quietLog()}
	if o.router != nil {
		o.router(&ro)
	}
	s.rt, err = New(pctx, ro)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.rt.Close)
	s.router = serveRouter(t, s.rt)
	return s
}

// testServer is a router served on a loopback port by its fasthttp server.
type testServer struct {
	URL string
	srv *fasthttp.Server
}

func serveRouter(t testing.TB, rt *Router) *testServer {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ts := &testServer{URL: "http://" + ln.Addr().String(), srv: rt.Server()}
	// Idle workers go at once (fasthttp keeps them 10 s by default), so that
	// a goroutine count after a burst of clients measures leaks, not the
	// pool (TestLoad1000Streams).
	ts.srv.MaxIdleWorkerDuration = 50 * time.Millisecond
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = ts.srv.Serve(ln)
	}()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = ts.srv.ShutdownWithContext(ctx) // bounded: a failed test may leave a request parked
		<-done
	})
	return ts
}

// devVLLMHandler is `tilert dev-vllm` on the tiny model: prefill for
// TileRT, or native generation for requests without kv_transfer_params.
func devVLLMServer(t testing.TB, dir string, tok *tokenizer.Tokenizer) (*fasthttp.Server, func()) {
	t.Helper()
	w, err := model.OpenWeights(dir)
	if err != nil {
		t.Fatal(err)
	}
	mcfg, err := model.LoadConfig(dir)
	if err != nil {
		t.Fatal(err)
	}
	tr, err := rdma.NewTCP(rdma.TCPConfig{})
	if err != nil {
		t.Fatal(err)
	}
	sh := devprefill.NewShipper(w, mcfg, tr, 1024)
	hs := devvllm.New(devvllm.Options{Shipper: sh, Tokenizer: tok, ServedModel: "glm-5-tiny", Log: quietLog()}).NewHTTPServer()
	return hs, func() {
		sh.Close()
		_ = tr.Close()
	}
}

func quietLog() *slog.Logger {
	return slog.New(slog.NewTextHandler(io.Discard, nil))
}

// reference generates from prompt on the CPU engine directly: what the
// whole stack must reproduce (greedy).
func (s *stack) reference(t *testing.T, prompt []int, maxTokens int, ignoreEOS bool) (ids []int, finish string) {
	t.Helper()
	mcfg, err := model.LoadConfig(s.dir)
	if err != nil {
		t.Fatal(err)
	}
	p := engine.Params{MaxTokens: maxTokens}
	if !ignoreEOS {
		p.StopIDs = mcfg.EOS
	}
	ids, _, finish = s.referenceP(t, prompt, p)
	return ids, finish
}

// referenceP generates with p on the CPU engine directly, with the
// logprobs of every token when p asks for them.
func (s *stack) referenceP(t *testing.T, prompt []int, p engine.Params) (ids []int, lps []engine.TokenLogprobs, finish string) {
	t.Helper()
	mcfg, err := model.LoadConfig(s.dir)
	if err != nil {
		t.Fatal(err)
	}
	w, err := model.OpenWeights(s.dir)
	if err != nil {
		t.Fatal(err)
	}
	e, err := cpu.New(mcfg, w, engine.Options{Mode: engine.ModeServing, Slots: 1, MaxSeqLen: len(prompt) + p.MaxTokens + 8})
	if err != nil {
		t.Fatal(err)
	}
	first, err := e.Prefill(0, prompt, p)
	if err != nil {
		t.Fatal(err)
	}
	ids = []int{first}
	if lp, ok := e.PrefillLogprobs(0); ok {
		lps = append(lps, lp)
	}
	fin, err := e.Start(0, first, p)
	for err == nil && fin == engine.FinishNone {
		var res []engine.StepResult
		if res, err = e.Step([]int{0}); err == nil {
			ids = append(ids, res[0].Tokens...)
			lps = append(lps, res[0].Logprobs...)
			fin = res[0].Finish
		}
	}
	if err != nil {
		t.Fatal(err)
	}
	if fin == engine.FinishStop {
		return ids, lps, "stop"
	}
	return ids, lps, "length"
}

func (s *stack) post(t *testing.T, path string, body any) *http.Response {
	t.Helper()
	b, err := json.Marshal(body)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.Post(s.router.URL+path, "application/json", bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	return resp
}

// completion is a parsed answer, streamed or not.
type completion struct {
	text   string
	finish string
	usage  *openai.Usage
	chunks int
	raw    []string
}

func readJSON(t *testing.T, resp *http.Response, chat bool) completion {
	t.Helper()
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("status %s: %s", resp.Status, b)
	}
	var m struct {
		Object  string `json:"object"`
		Choices []struct {
			Text    string `json:"text"`
			Message struct {
				Role    string `json:"role"`
				Content string `json:"content"`
			} `json:"message"`
			FinishReason string `json:"finish_reason"`
		} `json:"choices"`
		Usage *openai.Usage `json:"usage"`
	}
	if err := json.Unmarshal(b, &m); err != nil || len(m.Choices) != 1 {
		t.Fatalf("bad body %s: %v", b, err)
	}
	c := completion{finish: m.Choices[0].FinishReason, usage: m.Usage, raw: []string{string(b)}}
	if chat {
		if m.Object != "chat.completion" || m.Choices[0].Message.Role != "assistant" {
			t.Fatalf("not a chat completion: %s", b)
		}
		c.text = m.Choices[0].Message.Content
	} else {
		if m.Object != "text_completion" {
			t.Fatalf("not a text completion: %s", b)
		}
		c.text = m.Choices[0].Text
	}
	return c
}

func readSSE(t *testing.T, resp *http.Response, chat bool) completion {
	t.Helper()
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		t.Fatalf("status %s: %s", resp.Status, b)
	}
	if ct := resp.Header.Get("Content-Type"); !strings.HasPrefix(ct, "text/event-stream") {
		t.Fatalf("Content-Type %q", ct)
	}
	var c completion
	sc := bufio.NewScanner(resp.Body)
	done := false
	for sc.Scan() {
		line := sc.Text()
		if line == "" {
			continue
		}
		data, ok := strings.CutPrefix(line, "data: ")
		if !ok {
			t.Fatalf("not an SSE data line: %q", line)
		}
		if done {
			t.Fatalf("data after [DONE]: %q", line)
		}
		if data == "[DONE]" {
			done = true
			continue
		}
		c.raw = append(c.raw, data)
		var m struct {
			Object  string `json:"object"`
			Choices []struct {
				Text  string `json:"text"`
				Delta struct {
					Content string `json:"content"`
				} `json:"delta"`
				FinishReason *string `json:"finish_reason"`
			} `json:"choices"`
			Usage *openai.Usage   `json:"usage"`
			Error json.RawMessage `json:"error"`
		}
		if err := json.Unmarshal([]byte(data), &m); err != nil {
			t.Fatalf("chunk %q: %v", data, err)
		}
		if m.Error != nil {
			t.Fatalf("error chunk: %s", data)
		}
		want := "text_completion"
		if chat {
			want = "chat.completion.chunk"
		}
		if m.Object != want {
			t.Fatalf("chunk object %q, want %q", m.Object, want)
		}
		if m.Usage != nil {
			if len(m.Choices) != 0 || c.usage != nil {
				t.Fatalf("usage chunk with choices, or twice: %s", data)
			}
			c.usage = m.Usage
			continue
		}
		if len(m.Choices) != 1 {
			t.Fatalf("chunk with %d choices: %s", len(m.Choices), data)
		}
		if c.finish != "" {
			t.Fatalf("chunk after the finish_reason chunk: %s", data)
		}
		c.chunks++
		if chat {
			c.text += m.Choices[0].Delta.Content
		} else {
			c.text += m.Choices[0].Text
		}
		if f := m.Choices[0].FinishReason; f != nil {
			c.finish = *f
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	if !done {
		t.Fatal("the stream did not end with [DONE]")
	}
	return c
}

// metricValue reads one sample from a Prometheus text exposition.
func metricValue(t *testing.T, url, series string) float64 {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, series+" "); ok {
			var f float64
			if _, err := fmt.Sscan(v, &f); err != nil {
				t.Fatalf("%s: %q", series, line)
			}
			return f
		}
	}
	return 0
}

// eventually polls cond (no timing assertion: it only bounds a hang).
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for i := 0; i < 2000; i++ {
		if cond() {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatalf("never: %s", what)
}
