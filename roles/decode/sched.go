package decode

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tilert-go/tilert/api/decodeapi"
	"github.com/tilert-go/tilert/engine"
	"github.com/tilert-go/tilert/pd"
)

// request is one /pd/decode from arrival to its final line.
type request struct {
	rid    string
	caller int // who started it (token index, or anonymous); only it may cancel
	first  int
	params engine.Params
	ready  *pd.Ready

	// waitCtx bounds the wait for state; cancel ends it early.
	waitCtx    context.Context
	waitCancel context.CancelFunc
	cancelled  atomic.Bool

	admitted chan error // the scheduler's Import+Start outcome

	mu     sync.Mutex
	notify chan struct{}            // cap 1: something was appended or the request ended
	toks   []int                    // generated, not yet taken by the writer
	lps    []decodeapi.TokenLogprob // their logprobs, when asked for
	n      int                      // tokens generated in total (first_token_id excluded)
	ended  bool
	final  decodeapi.FinalLine

	arrived, readyAt, startedAt time.Time
	drafted, accepted           int
}

func newRequest(rid string, first int, p engine.Params, timeout time.Duration) *request {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	return &request{rid: rid, first: first, params: p, waitCtx: ctx, waitCancel: cancel,
		admitted: make(chan error, 1), notify: make(chan struct{}, 1), arrived: time.Now()}
}

// cancel asks for the request to stop wherever it is.
func (r *request) cancel() {
	r.cancelled.Store(true)
	r.waitCancel()
}

func (r *request) signal() {
	select {
	case r.notify <- struct{}{}:
	default:
	}
}

func (r *request) push(toks []int, lps []engine.TokenLogprobs) {
	r.mu.Lock()
	r.toks = append(r.toks, toks...)
	for _, lp := range lps {
		w := decodeapi.TokenLogprob{P: float64(lp.Logprob)}
		for _, a := range lp.Top {
			w.Top = append(w.Top, decodeapi.TopLogprob{ID: a.ID, P: float64(a.Logprob)})
		}
		r.lps = append(r.lps, w)
	}
	r.n += len(toks)
	r.mu.Unlock()
	r.signal()
}

// end records the final line once.
func (r *request) end(f decodeapi.FinalLine) {
	r.mu.Lock()
	if !r.ended {
		r.ended = true
		r.final = f
	}
	r.mu.Unlock()
	r.signal()
}

// take returns the tokens not yet written (with their logprobs, when
// asked for) and, once ended, the final line.
func (r *request) take() (toks []int, lps []decodeapi.TokenLogprob, final *decodeapi.FinalLine) {
	r.mu.Lock()
	defer r.mu.Unlock()
	toks, r.toks = r.toks, nil
	lps, r.lps = r.lps, nil
	if r.ended && len(toks) == 0 {
		f := r.final
		return nil, nil, &f
	}
	return toks, lps, nil
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// schedule is the one goroutine that drives the engine: it admits ready
// requests (Import + Start), runs one batched Step over every active slot,
// fans the tokens out and frees finished, cancelled or failed slots.
func (n *Node) schedule(ctx context.Context) {
	defer close(n.done)
	var active []*request
	admitted := 0
	held := func() bool { return admitted < n.opts.minBatch }
	for {
		if len(active) == 0 || held() {
			select {
			case r := <-n.admitCh:
				active = n.admit(active, r)
				admitted++
			case <-n.wake:
			case <-ctx.Done():
				for _, r := range active {
					n.finish(r, decodeapi.FinishCancelled, "node shutting down")
				}
				return
			}
		}
		// Take every request that is ready to join without waiting.
	drain:
		for {
			select {
			case r := <-n.admitCh:
				active = n.admit(active, r)
				admitted++
			default:
				break drain
			}
		}
		kept := active[:0]
		for _, r := range active {
			if r.cancelled.Load() {
				n.finish(r, decodeapi.FinishCancelled, "")
				continue
			}
			kept = append(kept, r)
		}
		active = kept
		if len(active) == 0 || held() {
			continue
		}
		active = n.step(active)
		if n.opts.stepHook != nil {
			n.opts.stepHook()
		}
	}
}

// admit injects r's state (a hand-over: the bytes are already in the slot
// buffer) and starts it from its first token.
func (n *Node) admit(active []*request, r *request) []*request {
	rd := r.ready
	meta := engine.SlotMeta{SeqLen: rd.SeqLen, MTPLen: rd.MTPLen, LastToken: rd.LastPromptToken}
	if err := n.eng.Import(rd.Slot, meta, nil); err != nil {
		n.eng.Release(rd.Slot)
		n.releaseTable(r)
		r.admitted <- err
		return active
	}
	fin, err := n.eng.Start(rd.Slot, r.first, r.params)
	if err != nil {
		n.eng.Release(rd.Slot)
		n.releaseTable(r)
		r.admitted <- err
		return active
	}
	r.startedAt = time.Now()
	n.m.importSeconds.With().Observe(r.startedAt.Sub(r.readyAt).Seconds())
	r.admitted <- nil
	if fin != engine.FinishNone {
		n.finish(r, string(fin), "")
		return active
	}
	return append(active, r)
}

func (n *Node) step(active []*request) []*request {
	slots := make([]int, len(active))
	bySlot := make(map[int]*request, len(active))
	for i, r := range active {
		slots[i] = r.ready.Slot
		bySlot[r.ready.Slot] = r
	}
	if int64(len(active)) > n.stepMax.Load() {
		n.stepMax.Store(int64(len(active)))
	}
	t0 := time.Now()
	res, err := n.eng.Step(slots)
	n.m.stepSeconds.With().Observe(time.Since(t0).Seconds())
	n.m.stepBatch.With().Observe(float64(len(active)))
	if err != nil {
		n.log.Error("decode: engine step failed; ending every active request", "err", err.Error(), "slots", slots)
		for _, r := range active {
			n.finish(r, decodeapi.FinishError, err.Error())
		}
		return active[:0]
	}
	finished := map[int]string{}
	for _, sr := range res {
		r := bySlot[sr.Slot]
		if r == nil {
			continue
		}
		r.drafted += sr.Drafted
		r.accepted += sr.Accepted
		n.m.mtpDrafted.With().Add(float64(sr.Drafted))
		n.m.mtpAccepted.With().Add(float64(sr.Accepted))
		n.m.tokens.With().Add(float64(len(sr.Tokens)))
		r.push(sr.Tokens, sr.Logprobs)
		if sr.Finish != engine.FinishNone {
			finished[sr.Slot] = string(sr.Finish)
		}
	}
	kept := active[:0]
	for _, r := range active {
		if why, ok := finished[r.ready.Slot]; ok {
			n.finish(r, why, "")
			continue
		}
		kept = append(kept, r)
	}
	return kept
}

// releaseTable frees the table slot of a request the engine no longer holds.
func (n *Node) releaseTable(r *request) {
	if err := n.table.Release(r.ready.Slot, r.ready.Generation); err != nil {
		n.log.Warn("decode: releasing slot", "rid", r.rid, "slot", r.ready.Slot, "err", err.Error())
	}
}

// finish frees r's slot (engine first, then the table, so a new admit can
// only write into a free engine slot) and then sends its final line, so a
// router that sees the line may reuse the capacity at once.
func (n *Node) finish(r *request, reason, msg string) {
	n.eng.Release(r.ready.Slot)
	n.releaseTable(r)
	now := time.Now()
	f := decodeapi.FinalLine{Done: reason != decodeapi.FinishError, FinishReason: reason, TimingMS: map[string]float64{
		"wait_state": ms(r.readyAt.Sub(r.arrived)),
		"import":     ms(r.startedAt.Sub(r.readyAt)),
		"decode":     ms(now.Sub(r.startedAt)),
		"total":      ms(now.Sub(r.arrived)),
	}}
	if r.startedAt.IsZero() {
		f.TimingMS["import"], f.TimingMS["decode"] = 0, 0
	}
	if r.drafted > 0 {
		f.MTPAcceptMean = float64(r.accepted) / float64(r.drafted)
	}
	r.mu.Lock()
	f.N = r.n
	r.mu.Unlock()
	if reason == decodeapi.FinishError {
		f.Error, f.Message = string(decodeapi.CodeEngineError), msg
	}
	n.m.requests.With(reason).Inc()
	n.m.requestSeconds.With().Observe(now.Sub(r.arrived).Seconds())
	r.end(f)
}
