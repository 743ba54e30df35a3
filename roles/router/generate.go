package router

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"sync"
	"time"

	"github.com/cockroachdb/errors"
	"github.com/valyala/fasthttp"

	"github.com/tilert-go/tilert/api/decodeapi"
	"github.com/tilert-go/tilert/internal/auth"
	"github.com/tilert-go/tilert/internal/fastserve"
	"github.com/tilert-go/tilert/openai"
)

func endpoint(chat bool) string {
	if chat {
		return "chat_completions"
	}
	return "completions"
}

func (rt *Router) count(ep, outcome string, t0 time.Time) {
	rt.m.requests.With(ep, outcome).Inc()
	rt.m.requestDur.With(ep).Observe(time.Since(t0).Seconds())
}

// serveGen serves /v1/completions and /v1/chat/completions. Admission and
// prefill run in the handler, so their errors are plain HTTP statuses;
// once the first token is known the answer is 200, streamed from a body
// stream writer (SSE) or written as one JSON body.
func (rt *Router) serveGen(c *fasthttp.RequestCtx, chat bool) {
	t0 := time.Now()
	created := t0.Unix() // the request's time, as vLLM's created
	ep := endpoint(chat)
	body := append([]byte(nil), c.PostBody()...)
	req, e := rt.check(body, chat)
	if e != nil {
		writeError(c, e)
		rt.count(ep, outcomeBadRequest, t0)
		return
	}
	if req.spillReason != "" {
		if rt.spill != "" {
			rt.spillTo(c, body, req.spillReason, ep, t0)
			return
		}
		writeError(c, openai.BadField(req.spillPara, "field %s: %s", req.spillPara, req.spillMessage))
		rt.count(ep, outcomeBadRequest, t0)
		return
	}
	if req.generations() > 1 {
		rt.serveN(c, req, body, ep, t0, created)
		return
	}
	ctx, watch := fastserve.WatchConn(context.Background(), c.Conn())
	j, e, outcome := rt.admit(ctx, req, t0)
	if j == nil {
		rt.refuse(c, watch, body, ep, t0, e, outcome)
		return
	}
	b := j.base(j.rid, 0, created)
	if !req.Stream {
		em := &jsonEmitter{base: b}
		outcome := j.run(ctx, em)
		if watch.Close() {
			c.SetConnectionClose()
		}
		watch.Cancel()
		if em.err != nil {
			writeError(c, em.err)
		} else if em.body != nil {
			c.SetStatusCode(http.StatusOK)
			c.SetContentType("application/json")
			c.SetBody(em.body)
		}
		rt.count(ep, outcome, t0)
		return
	}
	sseHeaders(c)
	c.SetBodyStreamWriter(func(w *bufio.Writer) {
		em := &sseEmitter{base: b, w: w, includeUsage: req.IncludeUsage, gone: watch.Cancel}
		outcome := j.run(ctx, em)
		watch.Close()
		watch.Cancel()
		rt.count(ep, outcome, t0)
	})
}

// sseHeaders starts a 200 answer of SSE events, unbuffered on the way.
func sseHeaders(c *fasthttp.RequestCtx) {
	c.SetStatusCode(http.StatusOK)
	c.SetContentType("text/event-stream")
	c.Response.Header.Set("Cache-Control", "no-cache")
	c.Response.Header.Set("X-Accel-Buffering", "no")
}

// refuse answers a request that got no slot or no prefill: spilled to
// --spill-url when the pool was full or down, else the error.
func (rt *Router) refuse(c *fasthttp.RequestCtx, watch *fastserve.Watch, body []byte, ep string, t0 time.Time, e *openai.Error, outcome string) {
	if watch.Close() {
		c.SetConnectionClose()
	}
	watch.Cancel()
	if rt.spill != "" && (outcome == outcomeRejected || outcome == outcomeUnavailable) {
		reason := spillFull
		if outcome == outcomeUnavailable {
			reason = spillDown
		}
		rt.spillTo(c, body, reason, ep, t0)
		return
	}
	if e != nil {
		writeError(c, e)
	}
	rt.count(ep, outcome, t0)
}

// base is the emitters' state for the job's answer (choice index of the
// answer named after rid): what its prefill brought back for the client.
func (j *job) base(rid string, index int, created int64) base {
	b := newBase(j.req, j.rt.served, rid, created)
	b.index, b.promptTokens = index, j.pre.promptTokens
	if b.wantIDs {
		b.promptIDs = j.pre.promptIDs
	}
	b.promptLogprobs, b.promptText = j.pre.promptLogprobs, j.pre.promptText
	return b
}

// job is an admitted request: a slot on node n, its state prefilled there.
type job struct {
	rt   *Router
	req  *genRequest
	n    *node
	rid  string
	pre  *prefillResult
	t0   time.Time
	log  *slog.Logger
	once *sync.Once
	mu   sync.Mutex // guards n, rid, log, once against a client-gone cancel during a failover
}

// newRID is a capability: whoever knows it may decode the state it names,
// so it is 128 bits from crypto/rand (docs/SECURITY.md).
func newRID() string { return auth.RandomID("tilert-") }

func newToolCallID() string {
	return fmt.Sprintf("chatcmpl-tool-%016x%016x", rand.Uint64(), rand.Uint64())
}

// acquire takes a slot, mapping the gate's refusals to answers.
func (rt *Router) acquire(ctx context.Context, deadline time.Time) (*node, *openai.Error, string) {
	tq := time.Now()
	n, err := rt.gate.acquire(ctx, max(0, time.Until(deadline)))
	rt.m.queueWait.With().Observe(time.Since(tq).Seconds())
	if err == nil {
		return n, nil, ""
	}
	busy, total := rt.gate.busy()
	switch {
	case errors.Is(err, errQueueFull):
		rt.m.rejects.With("queue_full").Inc()
		return nil, &openai.Error{Status: http.StatusTooManyRequests, Type: "server_busy", Code: "queue_full", RetryAfter: time.Second,
			Message: fmt.Sprintf("all %d decode slots are busy (%d in use) and the queue of %d is full; retry later", total, busy, rt.opts.QueueSize)}, outcomeRejected
	case errors.Is(err, errQueueTimeout):
		rt.m.rejects.With("queue_timeout").Inc()
		return nil, &openai.Error{Status: http.StatusTooManyRequests, Type: "server_busy", Code: "queue_timeout", RetryAfter: time.Second,
			Message: fmt.Sprintf("no decode slot became free within %s (%d slots, all busy); retry later", time.Duration(rt.queueTimeout.Load()), total)}, outcomeRejected
	case errors.Is(err, errNoNodes):
		rt.m.rejects.With("no_nodes").Inc()
		return nil, rt.noNodes(), outcomeUnavailable
	}
	return nil, nil, outcomeCancelled
}

func (rt *Router) noNodes() *openai.Error {
	return &openai.Error{Status: http.StatusServiceUnavailable, Type: "upstream_error", Code: "decode_unavailable", RetryAfter: time.Second,
		Message: fmt.Sprintf("no decode node is up (%d configured; the router retries them with backoff): retry later", len(rt.nodes))}
}

// admit takes a slot and prefills the request for that node. A prefill
// that fails because the decode node is gone (vLLM's connector cannot
// reach it; the node does not answer /health) marks the node down and
// goes to another node.
func (rt *Router) admit(ctx context.Context, req *genRequest, t0 time.Time) (*job, *openai.Error, string) {
	return rt.admitOn(ctx, req, t0, nil)
}

// admitOn is admit with its first slot already taken on n0 (nil: take one
// from the gate); a failover takes the next from the gate.
func (rt *Router) admitOn(ctx context.Context, req *genRequest, t0 time.Time, n0 *node) (*job, *openai.Error, string) {
	deadline := t0.Add(time.Duration(rt.queueTimeout.Load()))
	for attempt := 0; ; attempt++ {
		n := n0
		if attempt > 0 || n == nil {
			var e *openai.Error
			var outcome string
			n, e, outcome = rt.acquire(ctx, deadline)
			if e != nil || n == nil {
				return nil, e, outcome
			}
		}
		rid := newRID()
		log := rt.log.With("rid", rid, "node", n.spec)
		tp := time.Now()
		pre, e := rt.prefill(ctx, req, n, rid)
		if e != nil {
			rt.m.prefill.With("error").Observe(time.Since(tp).Seconds())
			go rt.cancelOnNode(n, rid, "error", log) // vLLM may have shipped the state already: free the slot
			rt.gate.release(n)
			if ctx.Err() != nil {
				return nil, nil, outcomeCancelled
			}
			if e.Status >= 500 && e.Code != "prefill_unavailable" && !rt.nodeAlive(ctx, n) {
				rt.markDown(n, "prefill for it failed and /health does not answer: "+e.Message)
				rt.m.failovers.With("prefill").Inc()
				if attempt+1 < 2*len(rt.nodes) {
					continue
				}
				return nil, rt.noNodes(), outcomeUnavailable
			}
			log.Warn("router: prefill failed", "status", e.Status, "err", e.Message)
			return nil, e, outcomePrefillError
		}
		rt.m.prefill.With("ok").Observe(time.Since(tp).Seconds())
		rt.gate.mu.Lock()
		maxSeq := n.maxSeq
		rt.gate.mu.Unlock()
		if maxSeq > 0 && (pre.promptTokens >= maxSeq || (req.MaxTokensParam != "" && req.MaxTokens > 0 && pre.promptTokens+req.MaxTokens > maxSeq)) {
			go rt.cancelOnNode(n, rid, "error", log)
			rt.gate.release(n)
			if pre.promptTokens >= maxSeq {
				return nil, openai.PromptTooLongError(maxSeq, pre.promptTokens), outcomeBadRequest
			}
			return nil, openai.ContextError(req.MaxTokensParam, req.MaxTokens, maxSeq, pre.promptTokens), outcomeBadRequest
		}
		rt.m.tokens.With("prompt").Add(float64(pre.promptTokens))
		return &job{rt: rt, req: req, n: n, rid: rid, pre: pre, t0: t0, log: log, once: &sync.Once{}}, nil, ""
	}
}

func (j *job) cancel(reason string) {
	j.mu.Lock()
	n, rid, log, once := j.n, j.rid, j.log, j.once
	j.mu.Unlock()
	if n != nil {
		once.Do(func() { j.rt.cancelOnNode(n, rid, reason, log) })
	}
}

// cancelAsync is cancel in the background, for the job as it is now (a
// failover may move the job right after).
func (j *job) cancelAsync(reason string) {
	j.mu.Lock()
	rt, n, rid, log, once := j.rt, j.n, j.rid, j.log, j.once
	j.mu.Unlock()
	if n != nil {
		go once.Do(func() { rt.cancelOnNode(n, rid, reason, log) })
	}
}

// failover moves the job to another node after its node failed before
// any decoded token: a new slot, a new prefill there (its sampled token is
// dropped: the first token was already sent and stays).
func (j *job) failover(ctx context.Context, why string) *openai.Error {
	rt := j.rt
	rt.markDown(j.n, why)
	rt.m.failovers.With("decode").Inc()
	j.cancelAsync("error")
	rt.gate.release(j.n)
	j.mu.Lock()
	j.n = nil
	j.mu.Unlock()
	nj, e, _ := rt.admit(ctx, j.req, time.Now())
	if e != nil {
		if e.Code == "" {
			e = rt.noNodes()
		}
		return e
	}
	if nj == nil {
		return rt.noNodes()
	}
	nj.pre.first, nj.pre.finish, nj.pre.firstLP = j.pre.first, j.pre.finish, j.pre.firstLP
	j.mu.Lock()
	j.n, j.rid, j.pre, j.log, j.once = nj.n, nj.rid, nj.pre, nj.log, nj.once
	j.mu.Unlock()
	j.log.Info("router: request moved to another decode node", "why", why)
	return nil
}

// run decodes the job to its end through em and returns the outcome.
func (j *job) run(ctx context.Context, em emitter) string {
	rt, req := j.rt, j.req
	defer func() {
		if j.n != nil {
			rt.gate.release(j.n)
		}
	}()
	p := newPipeline(rt.tok, req, em)
	j.pre.firstLP = clipTop(j.pre.firstLP, req.TopLogprobs)
	em.start()
	p.token(j.pre.first, j.pre.firstLP)
	rt.m.ttft.With().Observe(time.Since(j.t0).Seconds())
	finish := ""
	switch {
	case p.ts.stopped:
		finish = p.stopReason()
	case j.pre.finish == "stop":
		finish = "stop"
	case req.MaxTokens == 1:
		finish = "length"
	}
	var relayErr *openai.Error
	if finish != "" {
		j.cancelAsync("first_token") // the state was shipped; nothing will decode it
	} else {
		// The decode stream runs under its own context: a client that leaves
		// is answered by /pd/cancel, and the stream is read to its end so the
		// slot is free on the node before the gate hands it to the next
		// request.
		dctx, dstop := context.WithCancel(context.Background())
		defer dstop()
		stopWatch := context.AfterFunc(ctx, func() {
			j.cancel("client_gone")
			time.AfterFunc(rt.opts.DrainTimeout, dstop)
		})
		defer stopWatch()
		for {
			d := req.decodeRequest(j.rid, j.pre.first, j.pre.promptIDs)
			resp, e, down := rt.startDecode(dctx, d, j.n)
			if e != nil {
				if ctx.Err() != nil {
					return outcomeCancelled
				}
				if down {
					if fe := j.failover(ctx, e.Message); fe == nil {
						continue
					} else {
						e = fe
					}
				} else {
					j.cancelAsync("error")
				}
				j.log.Warn("router: decode refused", "status", e.Status, "err", e.Message)
				em.fail(e)
				return outcomeDecodeError
			}
			var lines int
			finish, relayErr, lines = rt.relay(resp.Body, p, func() {
				reason := "stop_string"
				if p.repeated {
					reason = "repetition"
				}
				j.cancel(reason)
				time.AfterFunc(rt.opts.DrainTimeout, dstop)
			})
			resp.Body.Close()
			if relayErr != nil && lines == 0 && ctx.Err() == nil && relayErr.Code == "decode_stream_broken" {
				// The node died before its first decoded token: nothing but the
				// first token was sent, so another node can take over.
				if fe := j.failover(ctx, relayErr.Message); fe == nil {
					continue
				}
			}
			break
		}
	}
	rt.m.tokens.With("completion").Add(float64(p.ts.ids))
	if ctx.Err() != nil {
		return outcomeCancelled
	}
	if relayErr != nil {
		if relayErr.Code == "decode_stream_broken" && j.n != nil && !rt.nodeAlive(context.Background(), j.n) {
			rt.markDown(j.n, relayErr.Message)
		}
		j.log.Warn("router: decode stream failed", "err", relayErr.Message)
		em.fail(relayErr)
		return outcomeDecodeError
	}
	calls := p.end()
	if len(calls) > 0 && finish == "stop" && req.ToolChoice.Mode != openai.ToolChoiceNamed {
		finish = "tool_calls"
	}
	em.finish(finish, em.usageOf(j.pre.promptTokens, p.ts.ids), calls)
	return outcomeOK
}

func clipTop(lp *decodeapi.TokenLogprob, k int) *decodeapi.TokenLogprob {
	if lp != nil && len(lp.Top) > k {
		lp.Top = lp.Top[:k]
	}
	return lp
}

// relay reads the node's NDJSON stream into the pipeline and returns the
// OpenAI finish_reason and the number of token lines read. onStop runs
// once when a stop string ends the text; the rest of the stream is read
// and dropped.
func (rt *Router) relay(body io.Reader, p *pipeline, onStop func()) (string, *openai.Error, int) {
	br := bufio.NewReaderSize(body, 4096)
	last := time.Now()
	lines := 0
	for {
		line, err := br.ReadBytes('\n')
		if len(bytes.TrimSpace(line)) > 0 {
			m, jerr := decodeapi.ParseLine(line)
			if jerr != nil {
				return "", upstreamErr(http.StatusBadGateway, "decode_failed", "unreadable line from the decode node: %q", openai.Short(line)), lines
			}
			switch {
			case m.Error != "":
				return "", upstreamErr(http.StatusBadGateway, "decode_failed", "the decode node failed: %s: %s", m.Error, m.Message), lines
			case m.Done:
				switch {
				case p.ts.stopped:
					return p.stopReason(), nil, lines
				case m.FinishReason == decodeapi.FinishStop || m.FinishReason == decodeapi.FinishLength:
					return m.FinishReason, nil, lines
				}
				return "abort", nil, lines // cancelled on the node: the client left or the node is shutting down
			}
			if len(m.T) > 0 {
				now := time.Now()
				gap := now.Sub(last).Seconds() / float64(len(m.T))
				last = now
				for i, id := range m.T {
					if lines > 0 { // the first line also carries the node's state wait and import
						rt.m.itl.With().Observe(gap)
					}
					var lp *decodeapi.TokenLogprob
					if i < len(m.LP) {
						lp = &m.LP[i]
					}
					was := p.ts.stopped
					p.token(id, lp)
					if p.ts.stopped && !was {
						onStop()
					}
				}
				lines++
			}
		}
		if err != nil {
			return "", upstreamErr(http.StatusBadGateway, "decode_stream_broken", "the decode stream ended without its final line: %v", err), lines
		}
	}
}
