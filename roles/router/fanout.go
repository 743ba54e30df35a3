package router

import (
	"bufio"
	"context"
	"fmt"
	"net/http"
	"sync"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/tilert-go/tilert/internal/fastserve"
	"github.com/tilert-go/tilert/openai"
)

// serveN serves a request of n > 1 choices, or a completions batch of
// prompts, as one generation a choice on its own decode slot, as vLLM runs
// them: choice j of a prompt is sampled with seed + j (when a seed is
// given), each is prefilled on its own (vLLM's prefix cache makes the
// repeats cheap) and decoded on its own slot, and the answer carries every
// choice (index prompt * n + j), each prompt's tokens counted once. The
// slots are taken before any prefill, one such request at a time
// (Router.multi), so two of them cannot each hold part of the pool waiting
// for the rest. More generations than the pool's slots run in waves
// instead (serveWaves).
func (rt *Router) serveN(c *fasthttp.RequestCtx, req *genRequest, body []byte, ep string, t0 time.Time, created int64) {
	gens := req.generations()
	if _, slots := rt.gate.busy(); gens > slots {
		rt.serveWaves(c, req, body, ep, t0, created, max(1, slots))
		return
	}
	ctx, watch := fastserve.WatchConn(context.Background(), c.Conn())
	refuse := func(e *openai.Error, outcome string) { rt.refuse(c, watch, body, ep, t0, e, outcome) }

	deadline := t0.Add(time.Duration(rt.queueTimeout.Load()))
	select {
	case rt.multi <- struct{}{}:
	default:
		wait := time.NewTimer(max(0, time.Until(deadline)))
		select {
		case rt.multi <- struct{}{}:
			wait.Stop()
		case <-wait.C:
			rt.m.rejects.With("queue_timeout").Inc()
			refuse(&openai.Error{Status: http.StatusTooManyRequests, Type: "server_busy", Code: "queue_timeout", RetryAfter: time.Second,
				Message: fmt.Sprintf("another request of several choices held the pool for %s; retry later", time.Duration(rt.queueTimeout.Load()))}, outcomeRejected)
			return
		case <-ctx.Done():
			wait.Stop()
			refuse(nil, outcomeCancelled)
			return
		}
	}
	nodes := make([]*node, 0, gens)
	for len(nodes) < gens {
		n, e, outcome := rt.acquire(ctx, deadline)
		if e != nil || n == nil {
			<-rt.multi
			for _, n := range nodes {
				rt.gate.release(n)
			}
			refuse(e, outcome)
			return
		}
		nodes = append(nodes, n)
	}
	<-rt.multi

	jobs := make([]*job, gens)
	errs := make([]*openai.Error, gens)
	outcomes := make([]string, gens)
	var wg sync.WaitGroup
	for i := range gens {
		wg.Add(1)
		go func() {
			defer wg.Done()
			jobs[i], errs[i], outcomes[i] = rt.admitOn(ctx, req.child(i), t0, nodes[i])
		}()
	}
	wg.Wait()
	for i, j := range jobs {
		if j != nil {
			continue
		}
		// One choice could not start: the others' states are dropped and
		// their slots freed, and the request answers as that choice did.
		for _, o := range jobs {
			if o != nil {
				o.cancelAsync("error")
				rt.gate.release(o.n)
			}
		}
		refuse(errs[i], outcomes[i])
		return
	}

	bases := make([]base, gens)
	for i, j := range jobs {
		bases[i] = j.base(jobs[0].rid, i, created)
	}
	// A choice that fails ends the others (as vLLM aborts the request):
	// they are cancelled on their nodes.
	run := func(ems []emitter) string {
		rctx, stop := context.WithCancel(ctx)
		defer stop()
		var wg sync.WaitGroup
		outs := make([]string, len(jobs))
		for i, j := range jobs {
			wg.Add(1)
			go func() {
				defer wg.Done()
				if outs[i] = j.run(rctx, ems[i]); outs[i] != outcomeOK {
					stop()
				}
			}()
		}
		wg.Wait()
		for _, o := range outs { // the failure, not the cancellations it caused
			if o != outcomeOK && o != outcomeCancelled {
				return o
			}
		}
		for _, o := range outs {
			if o != outcomeOK {
				return o
			}
		}
		return outcomeOK
	}
	if !req.Stream {
		ems := make([]*jsonEmitter, gens)
		all := make([]emitter, gens)
		for i := range ems {
			ems[i] = &jsonEmitter{base: bases[i]}
			all[i] = ems[i]
		}
		outcome := run(all)
		rt.answerJSON(c, watch, req, ems, outcome, ep, t0)
		return
	}
	sseHeaders(c)
	c.SetBodyStreamWriter(func(w *bufio.Writer) {
		var mu sync.Mutex
		ems := make([]*sseEmitter, gens)
		all := make([]emitter, gens)
		for i := range ems {
			ems[i] = &sseEmitter{base: bases[i], w: w, includeUsage: req.IncludeUsage, gone: watch.Cancel, lock: &mu, multi: true}
			all[i] = ems[i]
		}
		rt.endSSE(watch, req, ems, run(all), nil, ep, t0)
	})
}

// mergeUsage is the usage of a request's generations (us in index order):
// each prompt's tokens once (its first choice's) and every generated token.
func (r *genRequest) mergeUsage(us []openai.Usage) openai.Usage {
	var u openai.Usage
	for i, x := range us {
		if i%r.N == 0 {
			u.PromptTokens += x.PromptTokens
		}
		u.CompletionTokens += x.CompletionTokens
		if d := x.CompletionTokensDetails; d != nil {
			if u.CompletionTokensDetails == nil {
				u.CompletionTokensDetails = &openai.CompletionTokensDetails{}
			}
			u.CompletionTokensDetails.ReasoningTokens += d.ReasoningTokens
		}
	}
	u.TotalTokens = u.PromptTokens + u.CompletionTokens
	return u
}

// answerJSON ends the connection's watch and writes the non-streamed
// answer of several choices: the first failed choice's error, else, when
// every choice ended well, the choices with their usage merged (each prompt
// counted once); then counts the request. A choice that never started
// (waves) is nil.
func (rt *Router) answerJSON(c *fasthttp.RequestCtx, watch *fastserve.Watch, req *genRequest, ems []*jsonEmitter, outcome, ep string, t0 time.Time) {
	if watch.Close() {
		c.SetConnectionClose()
	}
	watch.Cancel()
	defer rt.count(ep, outcome, t0)
	for _, em := range ems {
		if em != nil && em.err != nil {
			writeError(c, em.err)
			return
		}
	}
	if outcome != outcomeOK {
		return
	}
	us := make([]openai.Usage, len(ems))
	for i, em := range ems {
		us[i] = em.usage
	}
	c.SetStatusCode(http.StatusOK)
	c.SetContentType("application/json")
	c.SetBody(mergeJSON(ems, req.mergeUsage(us)))
}

// endSSE ends a stream of several choices: when every choice ended well one
// usage chunk (each prompt counted once) and [DONE]; else failed's error
// event, when a choice could not start after the 200 (waves), and [DONE].
// Then it ends the connection's watch and counts the request.
func (rt *Router) endSSE(watch *fastserve.Watch, req *genRequest, ems []*sseEmitter, outcome string, failed *openai.Error, ep string, t0 time.Time) {
	if outcome == outcomeOK {
		us := make([]openai.Usage, len(ems))
		for i, em := range ems {
			us[i] = em.usage
		}
		ems[0].end(req.mergeUsage(us))
	} else {
		if failed != nil {
			ems[0].event(failed.Body())
		}
		ems[0].done()
	}
	watch.Close()
	watch.Cancel()
	rt.count(ep, outcome, t0)
}
