package router

import (
	"bufio"
	"context"
	"sync"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/tilert-go/tilert/internal/fastserve"
	"github.com/tilert-go/tilert/openai"
)

// serveWaves serves a request of more generations (n x prompts) than the
// pool's width decode slots, as vLLM serves an n larger than its free
// sequence slots: the generations run in waves, at most width at once,
// each on a slot of its own taken with the gate's normal acquire and freed
// when it ends, the next one (in index order) taking its place. The answer
// is the one serveN's gang path gives: choice j of prompt i has index
// i * n + j and seed + j, usage counts each prompt once, a stream carries
// the choices' chunks by index, then one usage chunk and one [DONE].
//
// Choice 0 is admitted before the answer starts, as a single request is:
// a pool that is full or down refuses (or spills) the whole request with
// the usual status. A later choice that cannot start (its slot or its
// prefill fails) fails the request as in the gang path: the running
// choices are cancelled on their nodes and their slots freed; non-streamed
// the answer is that choice's error (spilled where a 429/503 would be),
// streamed it is an error event then [DONE].
//
// Design:
//   - No hold-and-wait: a choice holds one slot, and only while it
//     prefills and decodes, which end without waiting on anything else; the
//     next choice's slot is acquired by one loop, one choice at a time, so
//     the request has at most one waiter in the gate's queue (as the gang
//     path) and cannot flood a small --queue-size.
//   - So no Router.multi: multi serialises the gang path because a gang
//     request holds slots while it waits for more. A wave request never
//     does, so it cannot deadlock with a gang request or another wave (their
//     waiters get the slots its choices free, in FIFO order); holding multi
//     for its whole life (the sum of its waves, maybe minutes) would only
//     stall every n > 1 request behind it.
//   - The bound is width, the pool's slots when the request arrived: more
//     at once could never run (the gate has no more), fewer would leave
//     free slots idle while the request still has choices to run.
//   - Each later choice's queue deadline runs from when it starts waiting
//     for a slot (after a running choice of its own request made room), not
//     from the request's arrival: a request of several waves lasts longer
//     than --queue-timeout by design, and measured from t0 its third wave
//     would time out the moment the pool is busy, though it waited no longer
//     than a request arriving then. The wait for its own running choices is
//     not queueing; the wait in the gate is, and it is bounded alike.
func (rt *Router) serveWaves(c *fasthttp.RequestCtx, req *genRequest, body []byte, ep string, t0 time.Time, created int64, width int) {
	ctx, watch := fastserve.WatchConn(context.Background(), c.Conn())
	first, e, outcome := rt.admitOn(ctx, req.child(0), t0, nil)
	if first == nil {
		rt.refuse(c, watch, body, ep, t0, e, outcome)
		return
	}
	rt.m.waves.With(ep).Inc()
	gens := req.generations()
	if !req.Stream {
		ems := make([]*jsonEmitter, gens)
		outcome, failed := rt.runWaves(ctx, req, first, width, created, func(i int, b base) emitter {
			ems[i] = &jsonEmitter{base: b}
			return ems[i]
		})
		if failed != nil { // a choice could not start: the request answers as it did
			rt.refuse(c, watch, body, ep, t0, failed, outcome)
			return
		}
		rt.answerJSON(c, watch, req, ems, outcome, ep, t0)
		return
	}
	sseHeaders(c)
	c.SetBodyStreamWriter(func(w *bufio.Writer) {
		var mu sync.Mutex
		ems := make([]*sseEmitter, gens)
		outcome, failed := rt.runWaves(ctx, req, first, width, created, func(i int, b base) emitter {
			ems[i] = &sseEmitter{base: b, w: w, includeUsage: req.IncludeUsage, gone: watch.Cancel, lock: &mu, multi: true}
			return ems[i]
		})
		rt.endSSE(watch, req, ems, outcome, failed, ep, t0)
	})
}

// runWaves runs every generation of req, at most width at once, choice 0
// on first (admitted, its slot held), each later one, in index order, on a
// slot acquired when a running one has ended; mk makes choice i's emitter
// from its base (once per choice that starts, on its goroutine; choice 0's
// always, before any runs).
// It returns when every choice has ended, with the request's outcome and,
// when a choice could not start, that choice's error (nil otherwise). A
// choice that fails, or cannot start, cancels the others; so does ctx.
func (rt *Router) runWaves(ctx context.Context, req *genRequest, first *job, width int, created int64, mk func(i int, b base) emitter) (string, *openai.Error) {
	gens := req.generations()
	rid := first.rid // the answer's id; read before a failover may change it
	rctx, stop := context.WithCancel(ctx)
	defer stop()
	var (
		wg       sync.WaitGroup
		mu       sync.Mutex
		startErr *openai.Error
		startOut string
	)
	outs := make([]string, gens) // "": never started
	running := make(chan struct{}, width)
	cannotStart := func(e *openai.Error, outcome string) {
		if outcome != outcomeCancelled { // not a cancellation another failure caused
			mu.Lock()
			if startOut == "" {
				startErr, startOut = e, outcome
			}
			mu.Unlock()
		}
		stop()
	}
	// choice runs generation i: j admitted already (with its emitter em),
	// or admitted here on n (its slot, taken at tw).
	choice := func(i int, j *job, em emitter, n *node, tw time.Time) {
		defer wg.Done()
		defer func() { <-running }() // after run has freed the slot
		if j == nil {
			var e *openai.Error
			if j, e, outs[i] = rt.admitOn(rctx, req.child(i), tw, n); j == nil {
				cannotStart(e, outs[i]) // admitOn freed the slot and the state
				return
			}
		}
		if rctx.Err() != nil { // admitted as the request ended: send nothing
			j.cancelAsync("error")
			rt.gate.release(j.n)
			outs[i] = outcomeCancelled
			return
		}
		if em == nil {
			em = mk(i, j.base(rid, i, created))
		}
		if outs[i] = j.run(rctx, em); outs[i] != outcomeOK {
			stop()
		}
	}
	running <- struct{}{}
	wg.Add(1)
	// Choice 0's emitter exists whatever happens: the caller ends the
	// answer through it.
	go choice(0, first, mk(0, first.base(rid, 0, created)), nil, time.Time{})
	for i := 1; i < gens; i++ {
		select {
		case running <- struct{}{}: // a running choice has ended
		case <-rctx.Done():
		}
		if rctx.Err() != nil {
			break
		}
		tw := time.Now()
		n, e, outcome := rt.acquire(rctx, tw.Add(time.Duration(rt.queueTimeout.Load())))
		if n == nil {
			cannotStart(e, outcome)
			break
		}
		wg.Add(1)
		go choice(i, nil, nil, n, tw)
	}
	wg.Wait()
	if startOut != "" {
		return startOut, startErr
	}
	for _, o := range outs { // the failure, not the cancellations it caused
		if o != "" && o != outcomeOK && o != outcomeCancelled {
			return o, nil
		}
	}
	for _, o := range outs { // cancelled, or never started (the client left)
		if o != outcomeOK {
			return outcomeCancelled, nil
		}
	}
	return outcomeOK, nil
}
