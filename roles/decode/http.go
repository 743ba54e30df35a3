package decode

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"math/rand/v2"
	"strconv"
	"time"

	"github.com/cockroachdb/errors"
	"github.com/valyala/fasthttp"

	"github.com/tilert-go/tilert/api/decodeapi"
	"github.com/tilert-go/tilert/engine"
	"github.com/tilert-go/tilert/handoff"
	"github.com/tilert-go/tilert/internal/fastserve"
	"github.com/tilert-go/tilert/metrics"
	"github.com/tilert-go/tilert/pd"
)

func badRequest(format string, args ...any) *decodeapi.Error {
	return &decodeapi.Error{Code: decodeapi.CodeBadRequest, Message: fmt.Sprintf(format, args...)}
}

// parseDecode reads and checks a /pd/decode body; errors name the field.
func (n *Node) parseDecode(body []byte) (*decodeapi.DecodeRequest, engine.Params, time.Duration, *decodeapi.Error) {
	var req decodeapi.DecodeRequest
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
	case n.checkRID(req.RID) != nil:
		return nil, p, 0, n.checkRID(req.RID)
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
		case !(s.MinP >= 0 && s.MinP <= 1):
			return nil, p, 0, badRequest("field sampling.min_p: %g is outside [0, 1]", s.MinP)
		case len(s.BadWordsTokenIDs) > decodeapi.MaxBadWords:
			return nil, p, 0, badRequest("field sampling.bad_words_token_ids: %d sequences, at most %d", len(s.BadWordsTokenIDs), decodeapi.MaxBadWords)
		}
		for i, w := range s.BadWordsTokenIDs {
			if len(w) == 0 {
				return nil, p, 0, badRequest("field sampling.bad_words_token_ids[%d]: empty (every bad word is at least one token)", i)
			}
			for _, id := range w {
				if id < 0 || id >= vocab {
					return nil, p, 0, badRequest("field sampling.bad_words_token_ids[%d]: %d is outside the vocabulary [0, %d)", i, id, vocab)
				}
			}
		}
		switch {
		case !(s.PresencePenalty >= -2 && s.PresencePenalty <= 2):
			return nil, p, 0, badRequest("field sampling.presence_penalty: %g is outside [-2, 2]", s.PresencePenalty)
		case !(s.FrequencyPenalty >= -2 && s.FrequencyPenalty <= 2):
			return nil, p, 0, badRequest("field sampling.frequency_penalty: %g is outside [-2, 2]", s.FrequencyPenalty)
		case s.RepetitionPenalty < 0 || math.IsNaN(s.RepetitionPenalty):
			return nil, p, 0, badRequest("field sampling.repetition_penalty: %g must be greater than zero (0 or absent: off)", s.RepetitionPenalty)
		case s.MinTokens < 0:
			return nil, p, 0, badRequest("field sampling.min_tokens: %d is negative", s.MinTokens)
		case s.RepetitionPenalty != 0 && s.RepetitionPenalty != 1 && len(req.PromptTokenIDs) == 0:
			return nil, p, 0, badRequest("field prompt_token_ids: a repetition_penalty needs the prompt's ids")
		}
		for k, v := range s.LogitBias {
			id, err := strconv.Atoi(k)
			if err != nil || id < 0 || id >= vocab || math.IsNaN(v) {
				return nil, p, 0, badRequest("field sampling.logit_bias: %q: %g is not a token id in [0, %d) with a number", k, v, vocab)
			}
			if p.LogitBias == nil {
				p.LogitBias = map[int]float32{}
			}
			p.LogitBias[id] = float32(min(100, max(-100, v)))
		}
		p.PresencePenalty, p.FrequencyPenalty, p.RepetitionPenalty, p.MinTokens = s.PresencePenalty, s.FrequencyPenalty, s.RepetitionPenalty, s.MinTokens
		p.PromptIDs = req.PromptTokenIDs
		p.Temperature, p.TopP, p.TopK, p.MinP = s.Temperature, s.TopP, max(s.TopK, 0), s.MinP
		p.BadWords = s.BadWordsTokenIDs
		if tb := s.ThinkingBudget; tb != nil {
			switch {
			case tb.Budget < 0:
				return nil, p, 0, badRequest("field sampling.thinking_budget.budget: %d is negative", tb.Budget)
			case len(tb.EndIDs) == 0:
				return nil, p, 0, badRequest("field sampling.thinking_budget.end_ids: empty (the ids that close a thinking block)")
			case len(req.PromptTokenIDs) == 0:
				return nil, p, 0, badRequest("field prompt_token_ids: a thinking_budget needs the prompt's ids (where the prompt leaves a block open)")
			}
			for _, id := range append(append([]int(nil), tb.StartIDs...), tb.EndIDs...) {
				if id < 0 || id >= vocab {
					return nil, p, 0, badRequest("field sampling.thinking_budget: id %d is outside the vocabulary [0, %d)", id, vocab)
				}
			}
			p.Think = engine.NewThinkBudget(tb.Budget, tb.StartIDs, tb.EndIDs, req.PromptTokenIDs)
		}
		if s.Seed != nil {
			p.Seed = *s.Seed
		} else {
			p.Seed = rand.Uint64()
		}
	}
	if req.Logprobs != nil {
		if *req.Logprobs < 0 || *req.Logprobs > 20 {
			return nil, p, 0, badRequest("field logprobs: %d is outside [0, 20]", *req.Logprobs)
		}
		p.Logprobs, p.TopLogprobs = true, *req.Logprobs
	}
	for i, id := range req.PromptTokenIDs {
		if id < 0 || id >= vocab {
			return nil, p, 0, badRequest("field prompt_token_ids[%d]: %d is outside the vocabulary [0, %d)", i, id, vocab)
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
	// The route table is built once (fastserve.Routes); /pd/* asks the
	// caller for its bearer token first (authorize).
	auth := func(path string, h fasthttp.RequestHandler) fasthttp.RequestHandler {
		return func(ctx *fasthttp.RequestCtx) {
			if n.authorize(ctx, path) {
				h(ctx)
			}
		}
	}
	routes := map[string]fastserve.Route{
		decodeapi.PathDecode:       {Method: "POST", Handler: n.handleDecode},
		decodeapi.PathCancel:       {Method: "POST", Handler: n.handleCancel},
		decodeapi.PathHealth:       {Method: "GET", Handler: n.handleHealth},
		decodeapi.PathStatus:       {Method: "GET", Handler: n.handleStatus},
		decodeapi.PathCapabilities: {Method: "GET", Handler: n.handleCapabilities},
		decodeapi.PathMetrics:      {Method: "GET", Handler: n.handleMetrics},
	}
	for p, r := range routes {
		r.Handler = auth(p, r.Handler)
		routes[p] = r
	}
	refuse := func(ctx *fasthttp.RequestCtx, status int, msg string) {
		code := decodeapi.CodeNotFound
		if status == fasthttp.StatusMethodNotAllowed {
			code = decodeapi.CodeMethodNotAllowed
		}
		writeError(ctx, &decodeapi.Error{Code: code, Message: msg})
	}
	return &fasthttp.Server{
		Handler: fastserve.Routes(routes, refuse),
		Name:    "tilert-decode",
		// Slowloris: headers and body within the read timeout, idle
		// keep-alive connections closed (security.read_timeout_s,
		// idle_timeout_s); sizes capped (max_body_bytes, max_header_bytes:
		// fasthttp's read buffer is the header limit).
		ReadTimeout:        n.sec.Ctrl.ReadTimeout,
		IdleTimeout:        n.sec.Ctrl.IdleTimeout,
		MaxRequestBodySize: n.sec.MaxBodyBytes,
		ReadBufferSize:     n.sec.MaxHeaderBytes,
		ErrorHandler:       n.httpError,
		Logger:             fastserve.Logger{Log: n.log, Name: "decode"},
		// A streamed response ends when its request ends, not on a timer;
		// each write of it has its own deadline (streamWriteDeadline).
		WriteTimeout: 0,
	}
}

func writeError(ctx *fasthttp.RequestCtx, e *decodeapi.Error) {
	if h := e.RetryAfterHeader(); h != "" {
		ctx.Response.Header.Set("Retry-After", h)
	}
	fastserve.WriteJSON(ctx, e.Status(), e.Body())
}

// register admits a /pd/decode into the node's book-keeping, or refuses it:
// draining (503), the rid already has a live request (409), or no slot can
// take it (429): the rid holds no slot and every free slot is already
// promised to a request that is waiting for its state.
func (n *Node) register(r *request) *decodeapi.Error {
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
		return &decodeapi.Error{Code: decodeapi.CodeShuttingDown, Message: "the node is shutting down"}
	}
	if _, ok := n.reqs[r.rid]; ok {
		return &decodeapi.Error{Code: decodeapi.CodeDuplicateRID, Message: "request " + r.rid + " is already being served"}
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
			return &decodeapi.Error{Code: decodeapi.CodeBusy, RetryAfter: max(retry, time.Second),
				Message: fmt.Sprintf("all %d slots busy (%d free, %d requests waiting for state)", len(snap), free, waiting)}
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

func (n *Node) reject(ctx *fasthttp.RequestCtx, e *decodeapi.Error) {
	n.m.rejects.With("http", string(e.Code)).Inc()
	writeError(ctx, e)
}

func (n *Node) handleDecode(ctx *fasthttp.RequestCtx) {
	req, params, timeout, herr := n.parseDecode(ctx.PostBody())
	if herr != nil {
		n.reject(ctx, herr)
		return
	}
	r := newRequest(req.RID, *req.FirstTokenID, params, timeout)
	r.caller = n.caller(ctx)
	if herr := n.register(r); herr != nil {
		r.waitCancel()
		n.reject(ctx, herr)
		return
	}
	stream := req.Streamed()
	// A client that leaves while its request waits or decodes takes the
	// request with it (a waiter would otherwise hold its promise of a
	// slot until timeout_s, and a non-streamed decode run to the end).
	stopWatch := watchClient(ctx, func() {
		n.log.Info("decode: client gone; cancelling", "rid", r.rid)
		r.cancel()
		n.poke()
	})
	streaming := false
	defer func() {
		if !streaming {
			stopWatch()
		}
	}()

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
			n.reject(ctx, &decodeapi.Error{Code: decodeapi.CodeShuttingDown,
				Message: "the node is shutting down; its ctrl port no longer takes state"})
		case errors.Is(err, pd.ErrCancelled) || (errors.Is(err, pd.ErrTimeout) && r.cancelled.Load()):
			n.m.requests.With(decodeapi.FinishCancelled).Inc()
			f := decodeapi.FinalLine{Done: true, FinishReason: decodeapi.FinishCancelled,
				TimingMS: map[string]float64{"wait_state": ms(r.readyAt.Sub(r.arrived)), "total": ms(r.readyAt.Sub(r.arrived))}}
			if stream {
				ctx.SetContentType(decodeapi.ContentTypeNDJSON)
				b, _ := json.Marshal(f)
				ctx.SetBody(append(b, '\n'))
			} else {
				fastserve.WriteJSON(ctx, fasthttp.StatusOK, decodeapi.DecodeResponse{RID: r.rid, T: []int{}, FinalLine: f})
			}
		case errors.Is(err, pd.ErrTimeout):
			n.reject(ctx, &decodeapi.Error{Code: decodeapi.CodeKVTransferTimeout,
				Message: fmt.Sprintf("the state of request %s did not arrive within %s", r.rid, timeout)})
		case errors.Is(err, pd.ErrDuplicate):
			n.reject(ctx, &decodeapi.Error{Code: decodeapi.CodeDuplicateRID, Message: err.Error()})
		default:
			writeError(ctx, &decodeapi.Error{Code: decodeapi.CodeInternal, Message: err.Error()})
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
		n.reject(ctx, &decodeapi.Error{Code: decodeapi.CodeShuttingDown, Message: "the node is shutting down"})
		return
	}
	if err := <-r.admitted; err != nil {
		n.unregister(r)
		n.m.requests.With(decodeapi.FinishError).Inc()
		n.log.Warn("decode: injecting state failed", "rid", r.rid, "slot", rd.Slot, "err", err.Error())
		writeError(ctx, &decodeapi.Error{Code: decodeapi.CodeImportFailed, Message: err.Error()})
		return
	}

	if !stream {
		resp := decodeapi.DecodeResponse{RID: r.rid, T: []int{}}
		for {
			<-r.notify
			toks, lps, final := r.take()
			resp.T = append(resp.T, toks...)
			resp.LP = append(resp.LP, lps...)
			if final != nil {
				resp.FinalLine = *final
				break
			}
		}
		n.unregister(r)
		fastserve.WriteJSON(ctx, fasthttp.StatusOK, resp)
		return
	}
	ctx.SetContentType(decodeapi.ContentTypeNDJSON)
	ctx.Response.Header.Set("Cache-Control", "no-cache")
	streaming = true // the writer below owns the watch now
	conn := ctx.Conn()
	ctx.SetBodyStreamWriter(func(w *bufio.Writer) {
		defer n.unregister(r)
		defer stopWatch()
		defer func() {
			if conn != nil { // fasthttp sets no write deadline of its own (WriteTimeout 0)
				_ = conn.SetWriteDeadline(time.Time{})
			}
		}()
		gone := false
		for {
			<-r.notify
			for {
				toks, lps, final := r.take()
				if final != nil {
					stopWatch()
					if !gone {
						n.writeDeadline(conn)
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
				b, _ := json.Marshal(decodeapi.TokensLine{T: toks, LP: lps})
				// A reader that stops reading is cut off after the write
				// timeout instead of holding this writer forever.
				n.writeDeadline(conn)
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

func (n *Node) handleCancel(ctx *fasthttp.RequestCtx) {
	var req decodeapi.CancelRequest
	if err := json.Unmarshal(ctx.PostBody(), &req); err != nil {
		n.reject(ctx, badRequest("body is not a JSON object with a string rid: %v", err))
		return
	}
	if req.RID == "" {
		n.reject(ctx, badRequest("field rid: missing or empty"))
		return
	}
	if herr := n.checkRID(req.RID); herr != nil {
		n.reject(ctx, herr)
		return
	}
	caller := n.caller(ctx)
	n.mu.Lock()
	r := n.reqs[req.RID]
	n.mu.Unlock()
	if r != nil && r.caller != caller {
		// Only the caller that started a request may cancel it; to anyone
		// else it does not exist.
		n.log.Warn("decode: cancel of another caller's request refused", "rid", maskRID(req.RID))
		fastserve.WriteJSON(ctx, fasthttp.StatusOK, decodeapi.CancelResponse{RID: req.RID, Cancelled: false, State: decodeapi.CancelUnknown})
		return
	}
	inUse := n.table.Cancel(req.RID)
	n.mu.Lock()
	r = n.reqs[req.RID]
	state := decodeapi.CancelUnknown // admits for it are refused for a minute all the same
	if r != nil {
		state = decodeapi.CancelWaiting
		if r.ready != nil {
			state = decodeapi.CancelDecoding
		}
	} else if inUse {
		state = decodeapi.CancelDecoding
	}
	n.mu.Unlock()
	if r != nil {
		r.cancel()
		n.poke()
	}
	n.log.Info("decode: cancel", "rid", req.RID, "state", state)
	fastserve.WriteJSON(ctx, fasthttp.StatusOK, decodeapi.CancelResponse{RID: req.RID, Cancelled: true, State: state})
}

func (n *Node) handleHealth(ctx *fasthttp.RequestCtx) {
	n.mu.Lock()
	draining := n.draining
	n.mu.Unlock()
	if draining {
		fastserve.WriteJSON(ctx, fasthttp.StatusServiceUnavailable, decodeapi.Health{Status: "draining"})
		return
	}
	slots, busy := n.eng.Options().Slots, n.table.Busy()
	fastserve.WriteJSON(ctx, fasthttp.StatusOK, decodeapi.Health{Status: "ok", Slots: &slots, Busy: &busy})
}

// status is /decode_status; rids are masked unless full is set (the
// caller holds a /pd/* token).
func (n *Node) status(full bool) decodeapi.Status {
	snap := n.table.Snapshot()
	st := decodeapi.Status{MaxInflight: len(snap), Slots: make([]decodeapi.SlotStatus, len(snap)), Requests: []decodeapi.RequestStatus{}, MaxBatch: n.MaxBatch()}
	n.mu.Lock()
	st.Draining = n.draining
	for _, r := range n.reqs {
		rs := decodeapi.RequestStatus{RID: r.rid, State: decodeapi.RequestWaitingState, AgeMS: ms(time.Since(r.arrived))}
		r.mu.Lock()
		rs.Tokens = r.n
		r.mu.Unlock()
		if r.ready != nil {
			s := r.ready.Slot
			rs.State, rs.Slot = decodeapi.RequestDecoding, &s
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
	if !full {
		for i := range st.Slots {
			st.Slots[i].RID = maskRID(st.Slots[i].RID)
		}
		for i := range st.Requests {
			st.Requests[i].RID = maskRID(st.Requests[i].RID)
		}
	}
	return st
}

// handleStatus lists rids whole only to a caller with a /pd/* token.
func (n *Node) handleStatus(ctx *fasthttp.RequestCtx) {
	fastserve.WriteJSON(ctx, fasthttp.StatusOK, n.status(n.caller(ctx) != anonymous))
}

// Capabilities describes what the node serves.
func (n *Node) Capabilities() decodeapi.Capabilities {
	o := n.eng.Options()
	h := n.ctrl.Hello()
	return decodeapi.Capabilities{Model: n.opts.Model, Engine: "tilert-go/" + string(o.Mode), LayoutVersion: handoff.LayoutVersion,
		Layout: engine.LayoutVersion, KVCacheDType: string(o.MLACache), NumLayers: n.layout.NumLayers,
		MaxSeqLen: o.MaxSeqLen, MaxInflight: o.Slots, MTP: o.MTP, VocabSize: n.opts.VocabSize, EOS: n.opts.EOS,
		Protocol: pd.ProtocolVersion, Transport: h.Transport, Regions: h.Regions, Device: n.opts.Device, Devices: n.opts.Devices}
}

func (n *Node) handleCapabilities(ctx *fasthttp.RequestCtx) {
	fastserve.WriteJSON(ctx, fasthttp.StatusOK, n.Capabilities())
}

func (n *Node) handleMetrics(ctx *fasthttp.RequestCtx) {
	ctx.SetContentType(metrics.ContentType)
	_ = n.m.reg.Write(ctx)
}
