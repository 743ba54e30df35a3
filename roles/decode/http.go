package decode

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"strconv"
	"time"

	"github.com/cockroachdb/errors"
	"github.com/valyala/fasthttp"

	"github.com/tilert-go/tilert/engine"
	"github.com/tilert-go/tilert/metrics"
	"github.com/tilert-go/tilert/pd"
)

// DecodeRequest is the body of POST /pd/decode.
type DecodeRequest struct {
	RID string `json:"rid"`
	// FirstTokenID is the token prefill sampled (vLLM's max_tokens=1 output).
	FirstTokenID *int `json:"first_token_id"`
	// MaxTokens counts generated tokens including the first one, like the
	// client's max_tokens; absent or 0: only max_seq_len limits.
	MaxTokens    int       `json:"max_tokens"`
	Sampling     *Sampling `json:"sampling,omitempty"`
	StopTokenIDs []int     `json:"stop_token_ids,omitempty"`
	IgnoreEOS    bool      `json:"ignore_eos,omitempty"`
	// TimeoutS bounds the wait for the request's state (default: the
	// node's state_timeout_s).
	TimeoutS *float64 `json:"timeout_s,omitempty"`
	// Stream selects NDJSON lines (default true) or one JSON body.
	Stream *bool `json:"stream,omitempty"`
}

// Sampling is /pd/decode's sampling block.
type Sampling struct {
	Temperature float64 `json:"temperature"`     // 0: greedy
	TopP        float64 `json:"top_p,omitempty"` // 0 or 1: off
	TopK        int     `json:"top_k,omitempty"` // 0 or -1: off
	Seed        *uint64 `json:"seed,omitempty"`  // absent: random when sampling
}

// TokensLine is one streamed NDJSON line of token ids.
type TokensLine struct {
	T []int `json:"t"`
}

// DecodeResponse is the stream=false body; streamed, the same fields but
// "t" form the final line.
type DecodeResponse struct {
	RID string `json:"rid"`
	T   []int  `json:"t"`
	finalLine
}

type httpError struct {
	status int
	code   string
	msg    string
	retry  time.Duration
}

func (e *httpError) Error() string { return e.code + ": " + e.msg }

func badRequest(format string, args ...any) *httpError {
	return &httpError{status: fasthttp.StatusBadRequest, code: "bad_request", msg: fmt.Sprintf(format, args...)}
}

// parseDecode reads and checks a /pd/decode body; errors name the field.
func (n *Node) parseDecode(body []byte) (*DecodeRequest, engine.Params, time.Duration, *httpError) {
	var req DecodeRequest
	var p engine.Params
	dec := json.NewDecoder(bytes.NewReader(body))
	if err := dec.Decode(&req); err != nil {
		var te *json.UnmarshalTypeError
		if errors.As(err, &te) {
			return nil, p, 0, badRequest("field %s: got JSON %s, want %s", te.Field, te.Value, jsonKind(te.Type.Kind().String()))
		}
		return nil, p, 0, badRequest("body is not a JSON object: %v", err)
	}
	if dec.More() {
		return nil, p, 0, badRequest("body has data after the JSON object")
	}
	vocab := n.opts.VocabSize
	switch {
	case req.RID == "":
		return nil, p, 0, badRequest("field rid: missing or empty")
	case req.FirstTokenID == nil:
		return nil, p, 0, badRequest("field first_token_id: missing")
	case *req.FirstTokenID < 0 || *req.FirstTokenID >= vocab:
		return nil, p, 0, badRequest("field first_token_id: %d is outside the vocabulary [0, %d)", *req.FirstTokenID, vocab)
	case req.MaxTokens < 0:
		return nil, p, 0, badRequest("field max_tokens: %d is negative", req.MaxTokens)
	}
	for i, id := range req.StopTokenIDs {
		if id < 0 || id >= vocab {
			return nil, p, 0, badRequest("field stop_token_ids[%d]: %d is outside the vocabulary [0, %d)", i, id, vocab)
		}
	}
	p.MaxTokens = req.MaxTokens
	p.StopIDs = append(p.StopIDs, req.StopTokenIDs...)
	if !req.IgnoreEOS {
		p.StopIDs = append(p.StopIDs, n.opts.EOS...)
	}
	if s := req.Sampling; s != nil {
		switch {
		case s.Temperature < 0:
			return nil, p, 0, badRequest("field sampling.temperature: %g is negative", s.Temperature)
		case s.TopP < 0 || s.TopP > 1:
			return nil, p, 0, badRequest("field sampling.top_p: %g is outside [0, 1]", s.TopP)
		case s.TopK < -1:
			return nil, p, 0, badRequest("field sampling.top_k: %d (use -1 or 0 to disable)", s.TopK)
		}
		p.Temperature, p.TopP, p.TopK = s.Temperature, s.TopP, max(s.TopK, 0)
		if s.Seed != nil {
			p.Seed = *s.Seed
		} else {
			p.Seed = rand.Uint64()
		}
	}
	timeout := n.opts.StateTimeout
	if req.TimeoutS != nil {
		if *req.TimeoutS <= 0 || *req.TimeoutS > 3600 {
			return nil, p, 0, badRequest("field timeout_s: %g is outside (0, 3600]", *req.TimeoutS)
		}
		timeout = time.Duration(*req.TimeoutS * float64(time.Second))
	}
	return &req, p, timeout, nil
}

func jsonKind(k string) string {
	switch k {
	case "int", "int64", "uint64", "float64":
		return "a number"
	case "string":
		return "a string"
	case "bool":
		return "a boolean"
	case "slice":
		return "an array"
	case "struct", "ptr":
		return "an object"
	}
	return k
}

func (n *Node) newHTTPServer() *fasthttp.Server {
	return &fasthttp.Server{
		Handler:            n.route,
		Name:               "tilert-decode",
		ReadTimeout:        30 * time.Second,
		IdleTimeout:        2 * time.Minute,
		MaxRequestBodySize: 1 << 20,
		Logger:             fasthttpLogger{n},
		// A streamed response ends when its request ends, not on a timer.
		WriteTimeout: 0,
	}
}

type fasthttpLogger struct{ n *Node }

func (l fasthttpLogger) Printf(format string, args ...any) {
	l.n.log.Debug("decode: http: " + fmt.Sprintf(format, args...))
}

func (n *Node) route(ctx *fasthttp.RequestCtx) {
	path, method := string(ctx.Path()), string(ctx.Method())
	type route struct {
		method string
		h      func(*fasthttp.RequestCtx)
	}
	routes := map[string]route{
		"/pd/decode":     {"POST", n.handleDecode},
		"/pd/cancel":     {"POST", n.handleCancel},
		"/health":        {"GET", n.handleHealth},
		"/decode_status": {"GET", n.handleStatus},
		"/capabilities":  {"GET", n.handleCapabilities},
		"/metrics":       {"GET", n.handleMetrics},
	}
	rt, ok := routes[path]
	switch {
	case !ok:
		writeError(ctx, &httpError{status: fasthttp.StatusNotFound, code: "not_found", msg: "no endpoint " + path})
	case method != rt.method && !(rt.method == "GET" && method == "HEAD"):
		ctx.Response.Header.Set("Allow", rt.method)
		writeError(ctx, &httpError{status: fasthttp.StatusMethodNotAllowed, code: "method_not_allowed", msg: path + " takes " + rt.method})
	default:
		rt.h(ctx)
	}
}

func writeJSON(ctx *fasthttp.RequestCtx, status int, v any) {
	b, _ := json.Marshal(v)
	ctx.SetStatusCode(status)
	ctx.SetContentType("application/json")
	ctx.SetBody(append(b, '\n'))
}

func writeError(ctx *fasthttp.RequestCtx, e *httpError) {
	if e.retry > 0 {
		ctx.Response.Header.Set("Retry-After", strconv.Itoa(max(1, int((e.retry+time.Second-1)/time.Second))))
	}
	body := map[string]any{"error": e.code, "message": e.msg}
	if e.retry > 0 {
		body["retry_after_ms"] = e.retry.Milliseconds()
	}
	writeJSON(ctx, e.status, body)
}

// register admits a /pd/decode into the node's book-keeping, or refuses it:
// draining (503), the rid already has a live request (409), or no slot can
// take it (429): the rid holds no slot and every free slot is already
// promised to a request that is waiting for its state.
func (n *Node) register(r *request) *httpError {
	snap := n.table.Snapshot()
	holds, free := false, 0
	for _, s := range snap {
		if s.RID == r.rid && s.State != pd.SlotFree.String() {
			holds = true
		}
		if s.State == pd.SlotFree.String() {
			free++
		}
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.draining {
		return &httpError{status: fasthttp.StatusServiceUnavailable, code: "shutting_down", msg: "the node is shutting down"}
	}
	if _, ok := n.reqs[r.rid]; ok {
		return &httpError{status: fasthttp.StatusConflict, code: "duplicate_rid", msg: "request " + r.rid + " is already being served"}
	}
	if !holds {
		waiting := 0
		held := map[string]bool{}
		for _, s := range snap {
			held[s.RID] = s.RID != ""
		}
		for rid, q := range n.reqs {
			if q.ready == nil && !held[rid] {
				waiting++
			}
		}
		if waiting >= free {
			retry := n.table.Config().RetryAfter
			return &httpError{status: fasthttp.StatusTooManyRequests, code: "busy", retry: max(retry, time.Second),
				msg: fmt.Sprintf("all %d slots busy (%d free, %d requests waiting for state)", len(snap), free, waiting)}
		}
	}
	n.reqs[r.rid] = r
	return nil
}

func (n *Node) unregister(r *request) {
	n.mu.Lock()
	if n.reqs[r.rid] == r {
		delete(n.reqs, r.rid)
	}
	n.mu.Unlock()
	r.waitCancel()
}

func (n *Node) reject(ctx *fasthttp.RequestCtx, e *httpError) {
	n.m.rejects.With("http", e.code).Inc()
	writeError(ctx, e)
}

func (n *Node) handleDecode(ctx *fasthttp.RequestCtx) {
	req, params, timeout, herr := n.parseDecode(ctx.PostBody())
	if herr != nil {
		n.reject(ctx, herr)
		return
	}
	r := newRequest(req.RID, *req.FirstTokenID, params, timeout)
	if herr := n.register(r); herr != nil {
		r.waitCancel()
		n.reject(ctx, herr)
		return
	}
	stream := req.Stream == nil || *req.Stream

	rd, err := n.table.WaitReady(r.waitCtx, r.rid)
	r.readyAt = time.Now()
	n.m.waitSeconds.With().Observe(r.readyAt.Sub(r.arrived).Seconds())
	if err != nil {
		n.unregister(r)
		n.mu.Lock()
		draining := n.draining
		n.mu.Unlock()
		switch {
		case draining && !errors.Is(err, pd.ErrDuplicate):
			n.reject(ctx, &httpError{status: fasthttp.StatusServiceUnavailable, code: "shutting_down",
				msg: "the node is shutting down; its ctrl port no longer takes state"})
		case errors.Is(err, pd.ErrCancelled) || (errors.Is(err, pd.ErrTimeout) && r.cancelled.Load()):
			n.m.requests.With(finishCancelled).Inc()
			f := finalLine{Done: true, FinishReason: finishCancelled,
				TimingMS: map[string]float64{"wait_state": ms(r.readyAt.Sub(r.arrived)), "total": ms(r.readyAt.Sub(r.arrived))}}
			if stream {
				ctx.SetContentType("application/x-ndjson")
				b, _ := json.Marshal(f)
				ctx.SetBody(append(b, '\n'))
			} else {
				writeJSON(ctx, fasthttp.StatusOK, DecodeResponse{RID: r.rid, T: []int{}, finalLine: f})
			}
		case errors.Is(err, pd.ErrTimeout):
			n.reject(ctx, &httpError{status: fasthttp.StatusGatewayTimeout, code: "kv_transfer_timeout",
				msg: fmt.Sprintf("the state of request %s did not arrive within %s", r.rid, timeout)})
		case errors.Is(err, pd.ErrDuplicate):
			n.reject(ctx, &httpError{status: fasthttp.StatusConflict, code: "duplicate_rid", msg: err.Error()})
		default:
			writeError(ctx, &httpError{status: fasthttp.StatusInternalServerError, code: "internal", msg: err.Error()})
		}
		return
	}
	n.mu.Lock()
	r.ready = rd
	n.mu.Unlock()

	select {
	case n.admitCh <- r:
	case <-n.done:
		_ = n.table.Release(rd.Slot, rd.Generation)
		n.unregister(r)
		n.reject(ctx, &httpError{status: fasthttp.StatusServiceUnavailable, code: "shutting_down", msg: "the node is shutting down"})
		return
	}
	if err := <-r.admitted; err != nil {
		n.unregister(r)
		n.m.requests.With(finishError).Inc()
		n.log.Warn("decode: injecting state failed", "rid", r.rid, "slot", rd.Slot, "err", err.Error())
		writeError(ctx, &httpError{status: fasthttp.StatusInternalServerError, code: "import_failed", msg: err.Error()})
		return
	}

	if !stream {
		resp := DecodeResponse{RID: r.rid, T: []int{}}
		for {
			<-r.notify
			toks, final := r.take()
			resp.T = append(resp.T, toks...)
			if final != nil {
				resp.finalLine = *final
				break
			}
		}
		n.unregister(r)
		writeJSON(ctx, fasthttp.StatusOK, resp)
		return
	}
	ctx.SetContentType("application/x-ndjson")
	ctx.Response.Header.Set("Cache-Control", "no-cache")
	ctx.SetBodyStreamWriter(func(w *bufio.Writer) {
		defer n.unregister(r)
		gone := false
		for {
			<-r.notify
			for {
				toks, final := r.take()
				if final != nil {
					if !gone {
						b, _ := json.Marshal(final)
						_, _ = w.Write(append(b, '\n'))
						_ = w.Flush()
					}
					return
				}
				if len(toks) == 0 {
					break
				}
				if gone {
					continue
				}
				b, _ := json.Marshal(TokensLine{T: toks})
				_, _ = w.Write(append(b, '\n'))
				if err := w.Flush(); err != nil {
					// The client left: stop decoding for it.
					n.log.Info("decode: client gone mid-stream; cancelling", "rid", r.rid, "err", err.Error())
					gone = true
					r.cancel()
					n.poke()
				}
			}
		}
	})
}

// CancelRequest is the body of POST /pd/cancel.
type CancelRequest struct {
	RID string `json:"rid"`
}

func (n *Node) handleCancel(ctx *fasthttp.RequestCtx) {
	var req CancelRequest
	if err := json.Unmarshal(ctx.PostBody(), &req); err != nil {
		n.reject(ctx, badRequest("body is not a JSON object with a string rid: %v", err))
		return
	}
	if req.RID == "" {
		n.reject(ctx, badRequest("field rid: missing or empty"))
		return
	}
	inUse := n.table.Cancel(req.RID)
	n.mu.Lock()
	r := n.reqs[req.RID]
	state := "unknown" // admits for it are refused for a minute all the same
	if r != nil {
		state = "waiting"
		if r.ready != nil {
			state = "decoding"
		}
	} else if inUse {
		state = "decoding"
	}
	n.mu.Unlock()
	if r != nil {
		r.cancel()
		n.poke()
	}
	n.log.Info("decode: cancel", "rid", req.RID, "state", state)
	writeJSON(ctx, fasthttp.StatusOK, map[string]any{"rid": req.RID, "cancelled": true, "state": state})
}

func (n *Node) handleHealth(ctx *fasthttp.RequestCtx) {
	n.mu.Lock()
	draining := n.draining
	n.mu.Unlock()
	if draining {
		writeJSON(ctx, fasthttp.StatusServiceUnavailable, map[string]any{"status": "draining"})
		return
	}
	writeJSON(ctx, fasthttp.StatusOK, map[string]any{"status": "ok", "slots": n.eng.Options().Slots, "busy": n.table.Busy()})
}

// SlotStatus is one slot in /decode_status.
type SlotStatus struct {
	pd.SlotInfo
	Tokens int `json:"tokens,omitempty"` // generated so far, while decoding
}

// RequestStatus is one live /pd/decode in /decode_status.
type RequestStatus struct {
	RID    string  `json:"rid"`
	State  string  `json:"state"` // waiting_state | decoding
	Slot   *int    `json:"slot,omitempty"`
	Tokens int     `json:"tokens"`
	AgeMS  float64 `json:"age_ms"`
}

// Status is the /decode_status body.
type Status struct {
	MaxInflight int             `json:"max_inflight"`
	Busy        int             `json:"busy"`
	Draining    bool            `json:"draining"`
	Slots       []SlotStatus    `json:"slots"`
	Requests    []RequestStatus `json:"requests"`
	MaxBatch    int             `json:"max_batch"`
}

func (n *Node) status() Status {
	snap := n.table.Snapshot()
	st := Status{MaxInflight: len(snap), Slots: make([]SlotStatus, len(snap)), Requests: []RequestStatus{}, MaxBatch: n.MaxBatch()}
	n.mu.Lock()
	st.Draining = n.draining
	for _, r := range n.reqs {
		rs := RequestStatus{RID: r.rid, State: "waiting_state", AgeMS: ms(time.Since(r.arrived))}
		r.mu.Lock()
		rs.Tokens = r.n
		r.mu.Unlock()
		if r.ready != nil {
			s := r.ready.Slot
			rs.State, rs.Slot = "decoding", &s
		}
		st.Requests = append(st.Requests, rs)
	}
	n.mu.Unlock()
	for i, s := range snap {
		st.Slots[i].SlotInfo = s
		if s.State != pd.SlotFree.String() {
			st.Busy++
		}
		for _, rs := range st.Requests {
			if rs.Slot != nil && *rs.Slot == i && rs.RID == s.RID {
				st.Slots[i].Tokens = rs.Tokens
			}
		}
	}
	return st
}

func (n *Node) handleStatus(ctx *fasthttp.RequestCtx) { writeJSON(ctx, fasthttp.StatusOK, n.status()) }

// Capabilities is the /capabilities body.
type Capabilities struct {
	Model         string         `json:"model"`
	Engine        string         `json:"engine"`
	LayoutVersion int            `json:"layout_version"`
	Layout        string         `json:"layout"`
	KVCacheDType  string         `json:"kv_cache_dtype"`
	NumLayers     int            `json:"num_layers"`
	MaxSeqLen     int            `json:"max_seq_len"`
	MaxInflight   int            `json:"max_inflight"`
	MTP           bool           `json:"mtp"`
	VocabSize     int            `json:"vocab_size"`
	EOS           []int          `json:"eos_token_ids"`
	Protocol      int            `json:"protocol_version"`
	Transport     pd.Transport   `json:"transport"`
	Regions       []pd.RegionCap `json:"regions"`
}

// Capabilities describes what the node serves.
func (n *Node) Capabilities() Capabilities {
	o := n.eng.Options()
	h := n.ctrl.Hello()
	return Capabilities{Model: n.opts.Model, Engine: "tilert-go/" + string(o.Mode), LayoutVersion: PDLayoutVersion,
		Layout: engine.LayoutVersion, KVCacheDType: string(o.MLACache), NumLayers: n.layout.NumLayers,
		MaxSeqLen: o.MaxSeqLen, MaxInflight: o.Slots, MTP: o.MTP, VocabSize: n.opts.VocabSize, EOS: n.opts.EOS,
		Protocol: pd.ProtocolVersion, Transport: h.Transport, Regions: h.Regions}
}

func (n *Node) handleCapabilities(ctx *fasthttp.RequestCtx) {
	writeJSON(ctx, fasthttp.StatusOK, n.Capabilities())
}

func (n *Node) handleMetrics(ctx *fasthttp.RequestCtx) {
	ctx.SetContentType(metrics.ContentType)
	_ = n.m.reg.Write(ctx)
}
