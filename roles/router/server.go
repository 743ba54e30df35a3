package router

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cockroachdb/errors"

	"github.com/tilert-go/tilert/metrics"
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
	Log          *slog.Logger
}

// Router is the OpenAI-compatible ingress for a TileRT decode pool.
type Router struct {
	opts     Options
	tok      *tokenizer.Tokenizer
	vllm     string
	nodes    []*node
	gate     *gate
	m        *routerMetrics
	client   *http.Client
	log      *slog.Logger
	served   string
	names    map[string]bool
	defaults samplingDefaults
	created  int64

	// queueTimeout is Options.QueueTimeout in nanoseconds, atomic so tests
	// can change it between phases.
	queueTimeout atomic.Int64

	vllmMu    sync.Mutex
	vllmModel string // vLLM's served model id, once learnt
}

const maxBody = 32 << 20

// New checks o, asks every decode node for its capabilities (retrying until
// ctx ends, so a router may start before its nodes), and returns a Router.
func New(ctx context.Context, o Options) (*Router, error) {
	if o.Log == nil {
		o.Log = slog.Default()
	}
	if o.DrainTimeout <= 0 {
		o.DrainTimeout = 30 * time.Second
	}
	if o.Tokenizer == nil {
		return nil, errors.WithHint(errors.New("router: no tokenizer"), "pass --model-path, the HF model directory with tokenizer.json")
	}
	if len(o.Nodes) == 0 {
		return nil, errors.WithHint(errors.New("router: no decode nodes"), "pass --decode host:ctrl_port:http_port (repeat for several)")
	}
	if !strings.HasPrefix(o.VLLMURL, "http://") && !strings.HasPrefix(o.VLLMURL, "https://") {
		return nil, errors.WithHint(errors.Newf("router: --vllm-url %q is not an http(s) URL", o.VLLMURL), "e.g. --vllm-url http://prefill-node:8000")
	}
	if o.QueueSize < 0 || o.QueueTimeout < 0 {
		return nil, errors.Newf("router: queue_size %d and queue_timeout %s must not be negative", o.QueueSize, o.QueueTimeout)
	}
	rt := &Router{opts: o, tok: o.Tokenizer, vllm: strings.TrimRight(o.VLLMURL, "/"), log: o.Log, created: time.Now().Unix(),
		client: &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 256, IdleConnTimeout: 90 * time.Second}}}
	for _, s := range o.Nodes {
		n, err := parseNode(s)
		if err != nil {
			return nil, err
		}
		rt.nodes = append(rt.nodes, n)
	}
	for _, n := range rt.nodes {
		if err := rt.probe(ctx, n); err != nil {
			return nil, err
		}
	}
	rt.queueTimeout.Store(int64(o.QueueTimeout))
	rt.gate = newGate(rt.nodes, o.QueueSize)
	rt.m = newRouterMetrics(rt.gate)
	rt.defaults = readDefaults(o.ModelPath)
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
	return rt, nil
}

// probe reads a node's /capabilities for its slot count, retrying while
// the node is starting.
func (rt *Router) probe(ctx context.Context, n *node) error {
	var last error
	for i := 0; ; i++ {
		var c struct {
			MaxInflight int `json:"max_inflight"`
			MaxSeqLen   int `json:"max_seq_len"`
			VocabSize   int `json:"vocab_size"`
		}
		last = rt.getJSON(ctx, n.httpURL+"/capabilities", &c)
		if last == nil {
			if c.MaxInflight < 1 {
				return errors.Newf("router: decode node %s reports max_inflight %d", n.spec, c.MaxInflight)
			}
			if c.VocabSize > 0 && c.VocabSize < rt.tok.VocabSize() {
				rt.log.Warn("router: the tokenizer's vocabulary is larger than the decode node's model", "node", n.spec,
					"tokenizer", rt.tok.VocabSize(), "node_vocab", c.VocabSize)
			}
			n.slots, n.maxSeq = c.MaxInflight, c.MaxSeqLen
			rt.log.Info("router: decode node", "node", n.spec, "slots", n.slots, "max_seq_len", n.maxSeq)
			return nil
		}
		if i%10 == 0 {
			rt.log.Warn("router: decode node not answering yet; retrying", "node", n.spec, "err", last.Error())
		}
		select {
		case <-ctx.Done():
			return errors.WithHintf(errors.Wrapf(last, "router: decode node %s: GET /capabilities", n.spec),
				"start the decode node first (tilert decode), and check that %s is its http port", n.httpURL)
		case <-time.After(200 * time.Millisecond):
		}
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
	var l struct {
		Data []struct {
			ID string `json:"id"`
		} `json:"data"`
	}
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

// readDefaults reads generation_config.json's sampling defaults, which
// vLLM applies too; the router resolves them so prefill and decode sample
// alike.
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

// Handler serves the router's HTTP API.
func (rt *Router) Handler() http.Handler {
	routes := map[string]struct {
		method string
		h      http.HandlerFunc
	}{
		"/v1/completions":      {http.MethodPost, func(w http.ResponseWriter, r *http.Request) { rt.serveGen(w, r, false) }},
		"/v1/chat/completions": {http.MethodPost, func(w http.ResponseWriter, r *http.Request) { rt.serveGen(w, r, true) }},
		"/v1/models":           {http.MethodGet, rt.serveModels},
		"/health":              {http.MethodGet, rt.serveHealth},
		"/metrics":             {http.MethodGet, rt.serveMetrics},
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rte, ok := routes[r.URL.Path]
		switch {
		case !ok:
			writeError(w, &apiError{status: http.StatusNotFound, typ: "not_found_error", message: "no endpoint " + r.URL.Path})
		case r.Method != rte.method && !(rte.method == http.MethodGet && r.Method == http.MethodHead):
			w.Header().Set("Allow", rte.method)
			writeError(w, &apiError{status: http.StatusMethodNotAllowed, typ: "invalid_request_error",
				message: r.URL.Path + " takes " + rte.method})
		default:
			rte.h(w, r)
		}
	})
}

func (rt *Router) serveModels(w http.ResponseWriter, _ *http.Request) {
	maxLen := 0
	for _, n := range rt.nodes {
		if maxLen == 0 || (n.maxSeq > 0 && n.maxSeq < maxLen) {
			maxLen = n.maxSeq
		}
	}
	writeJSON(w, http.StatusOK, map[string]any{"object": "list", "data": []any{map[string]any{
		"id": rt.served, "object": "model", "created": rt.created, "owned_by": "tilert", "root": rt.opts.ModelPath,
		"max_model_len": maxLen}}})
}

func (rt *Router) serveHealth(w http.ResponseWriter, _ *http.Request) {
	busy, total := rt.gate.busy()
	writeJSON(w, http.StatusOK, map[string]any{"status": "ok", "slots": total, "busy": busy, "queued": rt.gate.queued()})
}

func (rt *Router) serveMetrics(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", metrics.ContentType)
	_ = rt.m.reg.Write(w)
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	b, _ := json.Marshal(v)
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(append(b, '\n'))
}

func (rt *Router) serveGen(w http.ResponseWriter, r *http.Request, chat bool) {
	ep := "completions"
	if chat {
		ep = "chat_completions"
	}
	t0 := time.Now()
	outcome := rt.generate(w, r, chat, t0)
	rt.m.requests.With(ep, outcome).Inc()
	rt.m.requestDur.With(ep).Observe(time.Since(t0).Seconds())
}

// prefillResult is what the vLLM call gives.
type prefillResult struct {
	first        int
	finish       string // vLLM's finish_reason for its one token
	promptTokens int
}

func (rt *Router) generate(w http.ResponseWriter, r *http.Request, chat bool, t0 time.Time) string {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxBody))
	if err != nil {
		writeError(w, &apiError{status: http.StatusBadRequest, typ: "invalid_request_error", message: "reading the body: " + err.Error()})
		return outcomeBadRequest
	}
	req, aerr := rt.parseGen(body, chat)
	if aerr != nil {
		writeError(w, aerr)
		return outcomeBadRequest
	}
	ctx := r.Context()
	qt := time.Duration(rt.queueTimeout.Load())
	n, err := rt.gate.acquire(ctx, qt)
	rt.m.queueWait.With().Observe(time.Since(t0).Seconds())
	if err != nil {
		busy, total := rt.gate.busy()
		switch {
		case errors.Is(err, errQueueFull):
			rt.m.rejects.With("queue_full").Inc()
			writeError(w, &apiError{status: http.StatusTooManyRequests, typ: "server_busy", code: "queue_full", retry: time.Second,
				message: fmt.Sprintf("all %d decode slots are busy (%d in use) and the queue of %d is full; retry later", total, busy, rt.opts.QueueSize)})
			return outcomeRejected
		case errors.Is(err, errQueueTimeout):
			rt.m.rejects.With("queue_timeout").Inc()
			writeError(w, &apiError{status: http.StatusTooManyRequests, typ: "server_busy", code: "queue_timeout", retry: time.Second,
				message: fmt.Sprintf("no decode slot became free within %s (%d slots, all busy); retry later", qt, total)})
			return outcomeRejected
		}
		return outcomeCancelled
	}
	defer rt.gate.release(n)

	rid := newRID()
	log := rt.log.With("rid", rid, "node", n.spec)
	var once sync.Once
	cancel := func(reason string) {
		once.Do(func() { rt.cancelOnNode(n, rid, reason, log) })
	}
	tp := time.Now()
	pre, aerr := rt.prefill(ctx, req, n, rid)
	if aerr != nil {
		rt.m.prefill.With("error").Observe(time.Since(tp).Seconds())
		cancel("error") // vLLM may have shipped the state already: free the slot
		if ctx.Err() != nil {
			return outcomeCancelled
		}
		log.Warn("router: prefill failed", "status", aerr.status, "err", aerr.message)
		writeError(w, aerr)
		return outcomePrefillError
	}
	rt.m.prefill.With("ok").Observe(time.Since(tp).Seconds())
	rt.m.tokens.With("prompt").Add(float64(pre.promptTokens))

	ts := newTextStream(rt.tok, req)
	firstText := ts.add(pre.first)
	finish := ""
	switch {
	case ts.stopped || pre.finish == "stop":
		finish = "stop"
	case req.maxTokens == 1:
		finish = "length"
	}
	// The decode stream runs under its own context: a client that leaves is
	// answered by /pd/cancel, and the stream is read to its end so the slot
	// is free on the node before the gate hands it to the next request.
	dctx, dstop := context.WithCancel(context.WithoutCancel(ctx))
	defer dstop()
	// The first token goes out now, before the node answers: the client's
	// time to first token is the prefill's, not prefill + state transfer.
	// A decode failure after this point ends a stream with an error event
	// (a non-streamed answer is still a plain error status).
	em := newEmitter(w, req, rt.served, rid, rt.created)
	em.start()
	em.text(firstText)
	rt.m.ttft.With().Observe(time.Since(t0).Seconds())
	var resp *http.Response
	if finish != "" {
		cancel("first_token") // the state was shipped; nothing will decode it
	} else {
		stopWatch := context.AfterFunc(ctx, func() {
			cancel("client_gone")
			time.AfterFunc(rt.opts.DrainTimeout, dstop)
		})
		defer stopWatch()
		resp, aerr = rt.startDecode(dctx, req, n, rid, pre.first)
		if aerr != nil {
			cancel("error")
			if ctx.Err() != nil {
				return outcomeCancelled
			}
			log.Warn("router: decode refused", "status", aerr.status, "err", aerr.message)
			em.fail(aerr)
			return outcomeDecodeError
		}
		defer resp.Body.Close()
	}

	var relayErr *apiError
	if resp != nil {
		finish, relayErr = rt.relay(resp.Body, ts, em, func() {
			cancel("stop_string")
			time.AfterFunc(rt.opts.DrainTimeout, dstop)
		})
	}
	rt.m.tokens.With("completion").Add(float64(ts.ids))
	if ctx.Err() != nil {
		return outcomeCancelled
	}
	if relayErr != nil {
		log.Warn("router: decode stream failed", "err", relayErr.message)
		em.fail(relayErr)
		return outcomeDecodeError
	}
	em.text(ts.finish())
	em.finish(finish, usage{PromptTokens: pre.promptTokens, CompletionTokens: ts.ids, TotalTokens: pre.promptTokens + ts.ids})
	return outcomeOK
}

func newRID() string {
	return fmt.Sprintf("tilert-%016x%08x", rand.Uint64(), rand.Uint32())
}

// cancelOnNode tells the node to drop rid (its decode, or a state that
// arrived or is on its way). Cancelling is idempotent on the node.
func (rt *Router) cancelOnNode(n *node, rid, reason string, log *slog.Logger) {
	rt.m.cancels.With(reason).Inc()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	b, _ := json.Marshal(map[string]string{"rid": rid})
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, n.httpURL+"/pd/cancel", bytes.NewReader(b))
	if err != nil {
		return
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := rt.client.Do(req)
	if err != nil {
		log.Warn("router: /pd/cancel failed", "reason", reason, "err", err.Error())
		return
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	_ = resp.Body.Close()
	log.Debug("router: cancelled on the decode node", "reason", reason)
}

// prefill runs the request on vLLM for one token and reads that token's id.
func (rt *Router) prefill(ctx context.Context, req *genRequest, n *node, rid string) (*prefillResult, *apiError) {
	model := rt.vllmModelName(ctx)
	if model == "" {
		model = req.model
	}
	body, err := req.prefillBody(model, n, rid)
	if err != nil {
		return nil, &apiError{status: http.StatusInternalServerError, typ: "internal_error", message: err.Error()}
	}
	path := "/v1/completions"
	if req.chat {
		path = "/v1/chat/completions"
	}
	hreq, err := http.NewRequestWithContext(ctx, http.MethodPost, rt.vllm+path, bytes.NewReader(body))
	if err != nil {
		return nil, &apiError{status: http.StatusInternalServerError, typ: "internal_error", message: err.Error()}
	}
	hreq.Header.Set("Content-Type", "application/json")
	resp, err := rt.client.Do(hreq)
	if err != nil {
		return nil, &apiError{status: http.StatusBadGateway, typ: "upstream_error", code: "prefill_unavailable",
			message: fmt.Sprintf("the vLLM prefill server at %s is unreachable: %v", rt.vllm, err)}
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, maxBody))
	if err != nil {
		return nil, &apiError{status: http.StatusBadGateway, typ: "upstream_error", code: "prefill_failed",
			message: fmt.Sprintf("reading the vLLM prefill response: %v", err)}
	}
	if resp.StatusCode != http.StatusOK {
		msg := upstreamMessage(b)
		if resp.StatusCode >= 400 && resp.StatusCode < 500 && resp.StatusCode != http.StatusTooManyRequests {
			// The request itself is wrong for the model (prompt too long, bad
			// messages): the client's error, in vLLM's words.
			return nil, &apiError{status: resp.StatusCode, typ: "invalid_request_error", message: "vLLM prefill refused the request: " + msg}
		}
		return nil, &apiError{status: http.StatusBadGateway, typ: "upstream_error", code: "prefill_failed",
			message: fmt.Sprintf("the vLLM prefill server answered %s: %s", resp.Status, msg)}
	}
	var out struct {
		Choices []struct {
			FinishReason string `json:"finish_reason"`
			Logprobs     *struct {
				Tokens  []string `json:"tokens"`
				Content []struct {
					Token string `json:"token"`
				} `json:"content"`
			} `json:"logprobs"`
		} `json:"choices"`
		Usage *struct {
			PromptTokens int `json:"prompt_tokens"`
		} `json:"usage"`
	}
	if err := json.Unmarshal(b, &out); err != nil || len(out.Choices) == 0 {
		return nil, &apiError{status: http.StatusBadGateway, typ: "upstream_error", code: "prefill_failed",
			message: fmt.Sprintf("the vLLM prefill response has no choices: %s", short(b))}
	}
	c := out.Choices[0]
	var tok string
	if lp := c.Logprobs; lp != nil {
		if req.chat && len(lp.Content) > 0 {
			tok = lp.Content[0].Token
		} else if !req.chat && len(lp.Tokens) > 0 {
			tok = lp.Tokens[0]
		}
	}
	id, ok := parseTokenID(tok)
	if !ok {
		return nil, &apiError{status: http.StatusBadGateway, typ: "upstream_error", code: "prefill_no_token_id",
			message: fmt.Sprintf("the vLLM prefill response does not carry the first token as \"token_id:N\" in its logprobs (got %q); run vllm serve with --return-tokens-as-token-ids", tok)}
	}
	if id < 0 || id >= rt.tok.VocabSize() {
		return nil, &apiError{status: http.StatusBadGateway, typ: "upstream_error", code: "prefill_failed",
			message: fmt.Sprintf("vLLM's first token %d is outside the tokenizer's vocabulary [0, %d): is --model-path the model vLLM serves?", id, rt.tok.VocabSize())}
	}
	res := &prefillResult{first: id, finish: c.FinishReason}
	if out.Usage != nil {
		res.promptTokens = out.Usage.PromptTokens
	}
	return res, nil
}

func parseTokenID(s string) (int, bool) {
	rest, ok := strings.CutPrefix(s, "token_id:")
	if !ok {
		return 0, false
	}
	id, err := strconv.Atoi(rest)
	return id, err == nil
}

// upstreamMessage pulls the message out of an error body (OpenAI's
// {"error":{"message"}}, vLLM's older {"message"}, the node's
// {"error":code,"message"}), or returns the body.
func upstreamMessage(b []byte) string {
	var e struct {
		Message string          `json:"message"`
		Error   json.RawMessage `json:"error"`
	}
	if json.Unmarshal(b, &e) == nil {
		var inner struct {
			Message string `json:"message"`
		}
		if json.Unmarshal(e.Error, &inner) == nil && inner.Message != "" {
			return inner.Message
		}
		if e.Message != "" {
			return e.Message
		}
	}
	return strings.TrimSpace(short(b))
}

// startDecode asks the node to decode rid from the first token on.
func (rt *Router) startDecode(ctx context.Context, req *genRequest, n *node, rid string, first int) (*http.Response, *apiError) {
	sampling := map[string]any{"temperature": req.temperature, "top_p": req.topP, "top_k": req.topK}
	if req.seed != nil {
		sampling["seed"] = *req.seed
	}
	body := map[string]any{"rid": rid, "first_token_id": first, "max_tokens": req.maxTokens, "sampling": sampling,
		"stop_token_ids": req.stopTokenIDs, "ignore_eos": req.ignoreEOS, "stream": true}
	if req.stopTokenIDs == nil {
		body["stop_token_ids"] = []int{}
	}
	b, _ := json.Marshal(body)
	hreq, err := http.NewRequestWithContext(ctx, http.MethodPost, n.httpURL+"/pd/decode", bytes.NewReader(b))
	if err != nil {
		return nil, &apiError{status: http.StatusInternalServerError, typ: "internal_error", message: err.Error()}
	}
	hreq.Header.Set("Content-Type", "application/json")
	resp, err := rt.client.Do(hreq)
	if err != nil {
		return nil, &apiError{status: http.StatusBadGateway, typ: "upstream_error", code: "decode_unavailable",
			message: fmt.Sprintf("decode node %s is unreachable: %v", n.spec, err)}
	}
	if resp.StatusCode == http.StatusOK {
		return resp, nil
	}
	defer resp.Body.Close()
	eb, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<16))
	msg := upstreamMessage(eb)
	switch resp.StatusCode {
	case http.StatusTooManyRequests:
		retry := time.Second
		if s, err := strconv.Atoi(resp.Header.Get("Retry-After")); err == nil && s > 0 {
			retry = time.Duration(s) * time.Second
		}
		return nil, &apiError{status: http.StatusTooManyRequests, typ: "server_busy", code: "decode_busy", retry: retry,
			message: fmt.Sprintf("decode node %s is busy: %s", n.spec, msg)}
	case http.StatusGatewayTimeout:
		return nil, &apiError{status: http.StatusGatewayTimeout, typ: "upstream_error", code: "kv_transfer_timeout",
			message: fmt.Sprintf("the prefill state of this request did not reach decode node %s in time (%s); check that vLLM runs the TileRT connector and can reach %s:%d", n.spec, msg, n.host, n.ctrlPort)}
	case http.StatusServiceUnavailable:
		return nil, &apiError{status: http.StatusServiceUnavailable, typ: "upstream_error", code: "decode_unavailable", retry: time.Second,
			message: fmt.Sprintf("decode node %s is shutting down: %s", n.spec, msg)}
	}
	return nil, &apiError{status: http.StatusBadGateway, typ: "upstream_error", code: "decode_failed",
		message: fmt.Sprintf("decode node %s answered %s: %s", n.spec, resp.Status, msg)}
}

// relay reads the node's NDJSON stream into the text stream and emitter and
// returns the OpenAI finish_reason. onStop runs once when a stop string
// ends the text; the rest of the stream is read and dropped.
func (rt *Router) relay(body io.Reader, ts *textStream, em emitter, onStop func()) (string, *apiError) {
	br := bufio.NewReaderSize(body, 4096)
	last := time.Now()
	lines := 0
	for {
		line, err := br.ReadBytes('\n')
		if len(bytes.TrimSpace(line)) > 0 {
			var m struct {
				T            []int  `json:"t"`
				Done         bool   `json:"done"`
				FinishReason string `json:"finish_reason"`
				Error        string `json:"error"`
				Message      string `json:"message"`
			}
			if jerr := json.Unmarshal(line, &m); jerr != nil {
				return "", &apiError{status: http.StatusBadGateway, typ: "upstream_error", code: "decode_failed",
					message: fmt.Sprintf("unreadable line from the decode node: %q", short(line))}
			}
			switch {
			case m.Error != "":
				return "", &apiError{status: http.StatusBadGateway, typ: "upstream_error", code: "decode_failed",
					message: fmt.Sprintf("the decode node failed: %s: %s", m.Error, m.Message)}
			case m.Done:
				switch {
				case ts.stopped:
					return "stop", nil
				case m.FinishReason == "stop" || m.FinishReason == "length":
					return m.FinishReason, nil
				}
				return "abort", nil // cancelled on the node: the client left or the node is shutting down
			}
			if len(m.T) > 0 {
				now := time.Now()
				gap := now.Sub(last).Seconds() / float64(len(m.T))
				last = now
				for _, id := range m.T {
					if lines > 0 { // the first line also carries the node's state wait and import
						rt.m.itl.With().Observe(gap)
					}
					was := ts.stopped
					em.text(ts.add(id))
					if ts.stopped && !was {
						onStop()
					}
				}
				lines++
			}
		}
		if err != nil {
			return "", &apiError{status: http.StatusBadGateway, typ: "upstream_error", code: "decode_failed",
				message: fmt.Sprintf("the decode stream ended without its final line: %v", err)}
		}
	}
}
