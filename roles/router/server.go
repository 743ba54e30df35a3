package router

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cockroachdb/errors"
	"github.com/valyala/fasthttp"

	"github.com/tilert-go/tilert/api/decodeapi"
	"github.com/tilert-go/tilert/metrics"
	"github.com/tilert-go/tilert/openai"
	"github.com/tilert-go/tilert/openai/parsers"
	"github.com/tilert-go/tilert/tokenizer"
)

// Options configure a Router.
type Options struct {
	VLLMURL string   // base URL of the vLLM prefill server
	Nodes   []string // decode nodes as host:ctrl_port:http_port
	// Tokenizer is the model's (from --model-path): the router detokenises.
	Tokenizer *tokenizer.Tokenizer
	ModelPath string
	// ServedModel is the name clients send; empty: vLLM's served name when
	// it answers at start, else the model path's base name.
	ServedModel  string
	QueueSize    int
	QueueTimeout time.Duration
	// DrainTimeout bounds how long a cancelled decode stream may take to end
	// before the router drops it (default 30 s).
	DrainTimeout time.Duration
	// ToolCallParser and ReasoningParser name vLLM's parsers of the same
	// names (see package parsers); EnableAutoToolChoice allows
	// tool_choice "auto", as vLLM's --enable-auto-tool-choice.
	ToolCallParser       string
	ReasoningParser      string
	EnableAutoToolChoice bool
	// SpillURL is a native vLLM endpoint that takes the requests the TileRT
	// pool would refuse (full, or asking for what it cannot do); "" refuses
	// them.
	SpillURL string
	// HealthInterval is how often every node's /health is polled (default
	// 1 s); a node that fails is retried with backoff up to 30 s.
	HealthInterval time.Duration
	// PDToken is presented as a bearer token on the nodes' /pd/* (see
	// PDToken in guard.go); "" for nodes without tokens.
	PDToken string
	Log     *slog.Logger
}

// Router is the OpenAI-compatible ingress for a TileRT decode pool.
type Router struct {
	opts     Options
	tok      *tokenizer.Tokenizer
	vllm     string
	spill    string
	nodes    []*node
	gate     *gate
	m        *routerMetrics
	client   *http.Client
	log      *slog.Logger
	served   string
	names    map[string]bool
	defaults samplingDefaults
	created  int64 // when the router started (/v1/models)
	keepIDs  map[int]bool
	// thinkStart, thinkEnd are the reasoning parser's tags as ids (nil
	// without a parser): what thinking_token_budget counts between.
	thinkStart, thinkEnd []int
	// thinkIDs are the tags as single ids (-1: not one token), what
	// usage's reasoning_tokens counts between (vLLM's start/end_token_id).
	thinkIDs [2]int
	// multi lets one request of n > 1 take its slots at a time, so that two
	// cannot each hold part of the pool waiting for the rest (a one-token
	// semaphore: waiting on it keeps the request's deadline and its client).
	// Requests served in waves never take it (serveWaves says why).
	multi   chan struct{}
	handler fasthttp.RequestHandler

	// queueTimeout is Options.QueueTimeout in nanoseconds, atomic so tests
	// can change it between phases.
	queueTimeout atomic.Int64

	vllmMu    sync.Mutex
	vllmModel string // vLLM's served model id, once learnt

	stopPoll context.CancelFunc
	polling  sync.WaitGroup
}

const maxBody = 32 << 20

// New checks o, asks the decode nodes for their capabilities (retrying
// until ctx ends or one answers, so a router may start before its nodes;
// nodes that do not answer yet are marked down and polled), and returns a
// Router. Close stops its health polling.
func New(ctx context.Context, o Options) (*Router, error) {
	if o.Log == nil {
		o.Log = slog.Default()
	}
	if o.DrainTimeout <= 0 {
		o.DrainTimeout = 30 * time.Second
	}
	if o.HealthInterval <= 0 {
		o.HealthInterval = time.Second
	}
	if o.Tokenizer == nil {
		return nil, errors.WithHint(errors.New("router: no tokenizer"), "pass --model-path, the HF model directory with tokenizer.json")
	}
	if len(o.Nodes) == 0 {
		return nil, errors.WithHint(errors.New("router: no decode nodes"), "pass --decode host:ctrl_port:http_port (repeat for several)")
	}
	for _, u := range []struct{ flag, v string }{{"--vllm-url", o.VLLMURL}, {"--spill-url", o.SpillURL}} {
		if (u.flag == "--vllm-url" || u.v != "") && !strings.HasPrefix(u.v, "http://") && !strings.HasPrefix(u.v, "https://") {
			return nil, errors.WithHintf(errors.Newf("router: %s %q is not an http(s) URL", u.flag, u.v), "e.g. %s http://prefill-node:8000", u.flag)
		}
	}
	if o.QueueSize < 0 || o.QueueTimeout < 0 {
		return nil, errors.Newf("router: queue_size %d and queue_timeout %s must not be negative", o.QueueSize, o.QueueTimeout)
	}
	if err := parsers.CheckToolParser(o.ToolCallParser); err != nil {
		return nil, errors.Wrap(err, "router: --tool-call-parser")
	}
	if err := parsers.CheckReasoningParser(o.ReasoningParser); err != nil {
		return nil, errors.Wrap(err, "router: --reasoning-parser")
	}
	if o.EnableAutoToolChoice && o.ToolCallParser == "" {
		return nil, errors.WithHint(errors.New("router: --enable-auto-tool-choice needs --tool-call-parser"),
			"add --tool-call-parser glm47 (GLM-4.7/GLM-5), glm45 or deepseek_v32")
	}
	rt := &Router{opts: o, tok: o.Tokenizer, vllm: strings.TrimRight(o.VLLMURL, "/"), spill: strings.TrimRight(o.SpillURL, "/"),
		log: o.Log, created: time.Now().Unix(), multi: make(chan struct{}, 1),
		client: &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 1024, IdleConnTimeout: 90 * time.Second}}}
	for _, s := range o.Nodes {
		n, err := parseNode(s)
		if err != nil {
			return nil, err
		}
		rt.nodes = append(rt.nodes, n)
	}
	rt.gate = newGate(rt.nodes, o.QueueSize)
	if err := rt.probeAll(ctx); err != nil {
		return nil, err
	}
	rt.queueTimeout.Store(int64(o.QueueTimeout))
	rt.m = newRouterMetrics(rt.gate)
	rt.defaults = readDefaults(o.ModelPath)
	rt.keepIDs = map[int]bool{}
	for _, tag := range []string{"<think>", "</think>", "<tool_call>", "</tool_call>", "<arg_key>", "</arg_key>", "<arg_value>", "</arg_value>"} {
		if id, ok := rt.tok.TokenID(tag); ok {
			rt.keepIDs[id] = true
		}
	}
	rt.thinkIDs = [2]int{-1, -1}
	if o.ReasoningParser != "" {
		s, e := parsers.ReasoningTags()
		for i, tag := range []string{s, e} {
			if id, ok := rt.tok.TokenID(tag); ok {
				rt.thinkIDs[i] = id
			}
		}
		start, _ := rt.tok.Encode(s, false)
		end, _ := rt.tok.Encode(e, false)
		if len(start) > 0 && len(end) > 0 {
			rt.thinkStart, rt.thinkEnd = start, end
		}
	}
	rt.served = o.ServedModel
	rt.names = map[string]bool{}
	if id := rt.vllmModelName(ctx); id != "" {
		rt.names[id] = true
		if rt.served == "" {
			rt.served = id
		}
	}
	if o.ModelPath != "" {
		rt.names[o.ModelPath] = true
		rt.names[filepath.Base(filepath.Clean(o.ModelPath))] = true
		if rt.served == "" {
			rt.served = filepath.Base(filepath.Clean(o.ModelPath))
		}
	}
	if rt.served == "" {
		rt.served = "tilert"
	}
	rt.names[rt.served] = true
	rt.handler = rt.routes()
	pctx, cancel := context.WithCancel(context.Background())
	rt.stopPoll = cancel
	rt.polling.Add(1)
	go rt.pollHealth(pctx)
	return rt, nil
}

// Close stops the health polling.
func (rt *Router) Close() {
	rt.stopPoll()
	rt.polling.Wait()
}

// probeAll asks every node for its capabilities; it returns once at
// least one answers (the others are polled), or fails when none has by the
// time ctx ends.
func (rt *Router) probeAll(ctx context.Context) error {
	var last error
	for i := 0; ; i++ {
		for _, n := range rt.nodes {
			if err := rt.probe(ctx, n); err != nil {
				last = err
			}
		}
		if rt.gate.upCount() > 0 {
			for _, n := range rt.nodes {
				if !n.up {
					rt.log.Warn("router: decode node not answering; polling it", "node", n.spec, "err", n.lastErr)
				}
			}
			return nil
		}
		if i%10 == 0 {
			rt.log.Warn("router: no decode node answers yet; retrying", "err", last.Error())
		}
		select {
		case <-ctx.Done():
			return errors.WithHintf(errors.Wrap(last, "router: no decode node answers GET /capabilities"),
				"start the decode nodes first (tilert decode), and check that --decode names their ctrl and http ports (%s)", rt.nodes[0].spec)
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// probe reads a node's /capabilities and /health; on success the node is
// up with its slot count, max_seq_len and EOS ids.
func (rt *Router) probe(ctx context.Context, n *node) error {
	var c decodeapi.Capabilities
	err := rt.getJSON(ctx, n.httpURL+decodeapi.PathCapabilities, &c)
	if err == nil && c.MaxInflight < 1 {
		err = errors.Newf("decode node %s reports max_inflight %d", n.spec, c.MaxInflight)
	}
	if err == nil {
		var h decodeapi.Health
		err = rt.getJSON(ctx, n.httpURL+decodeapi.PathHealth, &h)
	}
	if err != nil {
		rt.gate.setUp(n, false, err.Error())
		return errors.Wrapf(err, "decode node %s", n.spec)
	}
	if c.VocabSize > 0 && c.VocabSize < rt.tok.VocabSize() {
		rt.log.Warn("router: the tokenizer's vocabulary is larger than the decode node's model", "node", n.spec,
			"tokenizer", rt.tok.VocabSize(), "node_vocab", c.VocabSize)
	}
	rt.gate.mu.Lock()
	n.slots, n.maxSeq, n.eos = c.MaxInflight, c.MaxSeqLen, c.EOS
	rt.gate.mu.Unlock()
	if rt.gate.setUp(n, true, "") {
		rt.log.Info("router: decode node up", "node", n.spec, "slots", c.MaxInflight, "max_seq_len", c.MaxSeqLen)
	}
	return nil
}

// pollHealth checks every node each interval: an up node whose /health
// fails is marked down; a down node is probed again after its backoff
// (doubling from the interval up to 30 s).
func (rt *Router) pollHealth(ctx context.Context) {
	defer rt.polling.Done()
	t := time.NewTicker(rt.opts.HealthInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		for _, n := range rt.nodes {
			rt.gate.mu.Lock()
			up, due := n.up, !time.Now().Before(n.nextProbe)
			rt.gate.mu.Unlock()
			if up {
				var h decodeapi.Health
				if err := rt.getJSON(ctx, n.httpURL+decodeapi.PathHealth, &h); err != nil && ctx.Err() == nil {
					rt.markDown(n, "health check: "+err.Error())
				}
				continue
			}
			if !due {
				continue
			}
			if err := rt.probe(ctx, n); err != nil {
				rt.gate.mu.Lock()
				n.backoff = min(max(2*n.backoff, rt.opts.HealthInterval), 30*time.Second)
				n.nextProbe = time.Now().Add(n.backoff)
				rt.gate.mu.Unlock()
			}
		}
	}
}

// markDown takes n out of the pool until a probe finds it back.
func (rt *Router) markDown(n *node, why string) {
	rt.gate.mu.Lock()
	if n.up {
		n.backoff = rt.opts.HealthInterval
		n.nextProbe = time.Now().Add(n.backoff)
	}
	rt.gate.mu.Unlock()
	if rt.gate.setUp(n, false, why) {
		rt.m.nodeDown.With().Inc()
		rt.log.Warn("router: decode node down", "node", n.spec, "why", why, "up", rt.gate.upCount())
	}
}

func (rt *Router) getJSON(ctx context.Context, url string, v any) error {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	resp, err := rt.client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return errors.Newf("GET %s: %s", url, resp.Status)
	}
	return json.NewDecoder(resp.Body).Decode(v)
}

// vllmModelName is vLLM's served model id (from its /v1/models), learnt
// once; "" while vLLM does not answer.
func (rt *Router) vllmModelName(ctx context.Context) string {
	rt.vllmMu.Lock()
	defer rt.vllmMu.Unlock()
	if rt.vllmModel != "" {
		return rt.vllmModel
	}
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	var l openai.ModelList
	if err := rt.getJSON(ctx, rt.vllm+"/v1/models", &l); err == nil && len(l.Data) > 0 {
		rt.vllmModel = l.Data[0].ID
	}
	return rt.vllmModel
}

func (rt *Router) knownModel(name string) bool {
	if rt.names[name] {
		return true
	}
	return name == rt.vllmModelName(context.Background())
}

// samplingDefaults are the model's generation_config.json values, which
// vLLM also applies to requests that leave a field out.
type samplingDefaults struct {
	Temperature *float64 `json:"temperature"`
	TopP        *float64 `json:"top_p"`
	TopK        *int     `json:"top_k"`
	MinP        *float64 `json:"min_p"`
	// The rest of vLLM's list (ModelConfig.get_diff_sampling_param).
	RepetitionPenalty *float64 `json:"repetition_penalty"`
	PresencePenalty   *float64 `json:"presence_penalty"`
	FrequencyPenalty  *float64 `json:"frequency_penalty"`
	MaxNewTokens      *int     `json:"max_new_tokens"`
	SkipSpecialTokens *bool    `json:"skip_special_tokens"`
}

// readDefaults reads generation_config.json's sampling defaults; the
// router resolves them so prefill and decode sample alike.
func readDefaults(dir string) samplingDefaults {
	var d samplingDefaults
	if dir == "" {
		return d
	}
	b, err := os.ReadFile(filepath.Join(dir, "generation_config.json"))
	if err == nil {
		_ = json.Unmarshal(b, &d)
	}
	return d
}

// Handler is the router's HTTP API (fasthttp).
func (rt *Router) Handler() fasthttp.RequestHandler { return rt.handler }

// Server is the one place the router's HTTP server is configured; callers
// may wrap Handler (auth, limits) before serving.
func (rt *Router) Server() *fasthttp.Server {
	return &fasthttp.Server{
		Handler:            rt.handler,
		Name:               "tilert-router",
		ReadTimeout:        30 * time.Second, // reading a request; streams are not bound by it
		IdleTimeout:        2 * time.Minute,
		MaxRequestBodySize: maxBody,
		// A streamed answer ends when its generation ends, not on a timer.
		WriteTimeout:                  0,
		NoDefaultServerHeader:         false,
		DisableHeaderNamesNormalizing: false,
		Logger:                        fasthttpLogger{rt.log},
	}
}

type fasthttpLogger struct{ log *slog.Logger }

func (l fasthttpLogger) Printf(format string, args ...any) {
	l.log.Debug("router: http: " + strings.TrimSpace(fmt.Sprintf(format, args...)))
}

type route struct {
	method string
	h      fasthttp.RequestHandler
}

// routes builds the route table once.
func (rt *Router) routes() fasthttp.RequestHandler {
	table := map[string]route{
		"/v1/completions":      {http.MethodPost, func(c *fasthttp.RequestCtx) { rt.serveGen(c, false) }},
		"/v1/chat/completions": {http.MethodPost, func(c *fasthttp.RequestCtx) { rt.serveGen(c, true) }},
		"/v1/models":           {http.MethodGet, rt.serveModels},
		"/health":              {http.MethodGet, rt.serveHealth},
		"/metrics":             {http.MethodGet, rt.serveMetrics},
	}
	return func(c *fasthttp.RequestCtx) {
		r, ok := table[string(c.Path())]
		method := string(c.Method())
		switch {
		case !ok:
			writeError(c, &openai.Error{Status: http.StatusNotFound, Type: "not_found_error", Message: "no endpoint " + string(c.Path())})
		case method != r.method && !(r.method == http.MethodGet && method == http.MethodHead):
			c.Response.Header.Set("Allow", r.method)
			writeError(c, &openai.Error{Status: http.StatusMethodNotAllowed, Type: "invalid_request_error",
				Message: string(c.Path()) + " takes " + r.method})
		default:
			r.h(c)
		}
	}
}

func writeJSON(c *fasthttp.RequestCtx, status int, v any) {
	b, _ := json.Marshal(v)
	c.SetStatusCode(status)
	c.SetContentType("application/json")
	c.SetBody(append(b, '\n'))
}

func writeError(c *fasthttp.RequestCtx, e *openai.Error) {
	if e.RetryAfter > 0 {
		c.Response.Header.Set("Retry-After", retryAfter(e.RetryAfter))
	}
	writeJSON(c, e.Status, e.Body())
}

func (rt *Router) serveModels(c *fasthttp.RequestCtx) {
	writeJSON(c, http.StatusOK, openai.ModelList{Object: "list", Data: []openai.Model{{ID: rt.served, Object: "model",
		Created: rt.created, OwnedBy: "tilert", Root: rt.opts.ModelPath, MaxModelLen: rt.gate.maxSeqLen()}}})
}

// Health is the router's /health body: 200 "ok" while at least one decode
// node is up, else 503 "unavailable".
type Health struct {
	Status  string `json:"status"`
	NodesUp int    `json:"nodes_up"`
	Nodes   int    `json:"nodes"`
	Slots   int    `json:"slots"`
	Busy    int    `json:"busy"`
	Queued  int    `json:"queued"`
}

func (rt *Router) serveHealth(c *fasthttp.RequestCtx) {
	busy, total := rt.gate.busy()
	h := Health{Status: "ok", NodesUp: rt.gate.upCount(), Nodes: len(rt.nodes), Slots: total, Busy: busy, Queued: rt.gate.queued()}
	status := http.StatusOK
	if h.NodesUp == 0 {
		h.Status, status = "unavailable", http.StatusServiceUnavailable
	}
	writeJSON(c, status, h)
}

func (rt *Router) serveMetrics(c *fasthttp.RequestCtx) {
	c.SetContentType(metrics.ContentType)
	_ = rt.m.reg.Write(c)
}
