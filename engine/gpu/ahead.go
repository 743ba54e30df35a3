package gpu

import (
	"os"

	"github.com/cockroachdb/errors"

	"github.com/tilert-go/tilert/cuda"
	"github.com/tilert-go/tilert/cuda/kernels"
	"github.com/tilert-go/tilert/engine"
)

// The pipelined decode step (engine.Ahead). A plain step (one row per slot,
// no drafts; logit adjustments uploaded and logprobs read back with the
// picks) queues its picks, copies the token
// ids into pinned host memory behind them and, before waiting for that
// copy, records and launches the next step's forward of the same slots one
// position on, its token ids copied on the device from the picks' output.
// The host then waits for the ids only, and its share of a step (the Go
// book-keeping between Step calls, recording the next step's ~300 calls,
// the meta upload, the launch) overlaps the device's work instead of
// leaving the GPU idle. The next Step whose forward is exactly those rows
// (same slots in the same order, same tokens and positions) and that
// follows with nothing else run on the device finds the forward's results
// in place; anything else (a slot finished at a stop token, a slot added or
// removed, an import, a prefill) runs its own forward, which rewrites the
// cache entries the discarded forward wrote (the same token at the same
// position writes the same bytes; other entries past a slot's length are
// never read).
//
// Safety: the forward started ahead writes its slots' caches after Step has
// returned, so every entry point that hands out or writes a slot's memory
// outside the stream (Release, SlotBuffer and so DeviceSlotBuffer) waits
// for it first, and every other device run discards it (runs on the same
// stream queue behind it). An error of that work is returned by the next
// call.

// pipeOn: TILERT_GPU_PIPELINE=0 turns the pipelined step off (each step
// then waits for its tokens before the next is recorded); =1 keeps it for
// plain steps only. By default (or =2) an MTP step also starts the next
// step's forward after its draft picks (pipeMTP). The plain step's took
// the 1-slot step at 8192 from 3.349 to 3.128 ms on the H200 (the graphs'
// device time, 3.126 ms) and 4 slots from 9.184 to 8.813 ms, same binary,
// same run (docs/measured/h200-2026-12-01-async); the MTP step's took
// 3.475 / 3.600 to 3.334 / 3.326 ms (DeepSeek-V3.2 dims, 3 MoE layers,
// 8192, one H100, A/B/A/B) and GLM-5's 3.664 / 3.652 to 3.531 / 3.509
// (docs/measured/h100-2026-12-05-s38 calls D-E).
var (
	pipeOn  = os.Getenv("TILERT_GPU_PIPELINE") != "0"
	pipeMTP = pipeOn && os.Getenv("TILERT_GPU_PIPELINE") != "1"
)

// aheadCopyOn: TILERT_GPU_AHEAD_COPY=0 keeps every copy of the pipelined
// step on the main stream (the form until session 45). Otherwise nothing
// but kernels sits between one step's graph and the next: the picks' ids
// go to the host on a copy stream of their own (downloadAsync), the next
// forward's meta goes up on another into the one of two device buffers
// that the forward before last used (beginMeta, uploadBeside), and that
// forward's embedding reads its tokens where the picks wrote them
// (picksInPlace) instead of a device copy into the meta. On the main
// stream each was a small copy between two kernels, paid every step.
var aheadCopyOn = os.Getenv("TILERT_GPU_AHEAD_COPY") != "0"

// mtpMetaPinOn: TILERT_GPU_MTP_META_PIN=0 uploads the MTP forward's meta
// from Go memory as before session 46. Otherwise it goes up from a pinned
// buffer of its own (aheadState.mtpPin): from pageable memory the copy
// call held the host ~50 us (bench's meta upload, H100), on the path of
// the MTP step's one host round trip (between the verify's picks and the
// MTP forward's launch); the plain step's pinned upload takes ~3.
var mtpMetaPinOn = os.Getenv("TILERT_GPU_MTP_META_PIN") != "0"

// aheadState is the backend's pipelined-step state.
type aheadState struct {
	// off: pipelining turned off for this engine (pipeOn at build; tests);
	// mtp: also after an MTP step's draft picks (pipeMTP at build).
	off, mtp bool
	// loose (tests only: the check that the discard path is tested) takes
	// any forward of as many rows as the one started ahead for it.
	loose bool
	// started, taken: forwards started ahead, and found in place by the
	// next step (the rest were discarded); adjusted: picks ahead with
	// logit adjustments or logprobs.
	started, taken, adjusted int
	// rows is the forward started ahead whose results (ws.hid, ws.logits,
	// the caches at its positions) are in place, tokens filled in once
	// read; nil: none.
	rows []fwdRow
	// inflight: the last run returned with work queued that no host call
	// has waited for.
	inflight bool
	// err is an error of work started ahead, for the next call.
	err error
	// tokPin receives the picked ids; metaPin[k] is the meta of the
	// forward started ahead, alternating (a buffer is rewritten only after
	// a wait that follows its upload).
	tokPin  []byte
	lpPin   []byte // logprob picks' results: [maxRows] logprobs, [maxRows][K] top ids, [maxRows][K] top logprobs
	metaPin [2][]byte
	// mtpPin is the MTP forward's meta (mtpMetaPinOn): rewritten by the
	// next MTP forward only, after a host wait that follows its upload (the
	// next step's picks, or the end of the run).
	mtpPin []byte
	k      int
	frees  []func() error
}

// drop discards the forward started ahead (the device's buffers are about
// to be used for something else).
func (e *backend) dropAhead() { e.ah.rows = nil }

// Drain implements engine.Drainer: it waits for work started ahead (the
// results stay valid for a matching Step).
func (e *backend) Drain() {
	if !e.ah.inflight {
		return
	}
	e.ah.inflight = false
	if err := e.r.run(func(b device) error { return b.sync() }); err != nil && e.ah.err == nil {
		e.ah.err = errors.Wrap(err, "device work started ahead of the step")
	}
}

// settle discards the forward started ahead, waits for it and returns its
// error, if any (the first thing every other device entry point does).
func (e *backend) settle() error {
	e.dropAhead()
	e.Drain()
	err := e.ah.err
	e.ah.err = nil
	return err
}

// aheadPins allocates the pinned buffers on first use.
func (e *backend) aheadPins(b device) error {
	if e.ah.tokPin != nil {
		return nil
	}
	alloc := func(n int) ([]byte, error) {
		buf, free, err := b.hostAlloc(n)
		if err != nil {
			return nil, errors.Wrapf(err, "pinned host buffer of %d bytes for the pipelined step", n)
		}
		e.ah.frees = append(e.ah.frees, free)
		return buf, nil
	}
	var err error
	if e.ah.tokPin, err = alloc(4 * e.maxRows); err != nil {
		return err
	}
	if e.ah.lpPin, err = alloc(4 * e.maxRows * (1 + 2*kernels.MaxTopLogprobs)); err != nil {
		e.ah.tokPin = nil
		return err
	}
	for k := range e.ah.metaPin {
		if e.ah.metaPin[k], err = alloc(6 * 4 * e.maxRows); err != nil { // beginMeta: row bases with TILERT_GPU_SLOT_MERGE=1
			e.ah.tokPin = nil
			return err
		}
	}
	if e.ah.mtpPin, err = alloc(6 * 4 * e.maxRows); err != nil {
		e.ah.tokPin = nil
		return err
	}
	return nil
}

// freeAheadPins releases the pinned buffers (Close, on the device thread).
func (e *backend) freeAheadPins() error {
	var errs error
	for _, f := range e.ah.frees {
		errs = errors.CombineErrors(errs, f())
	}
	e.ah.frees, e.ah.tokPin, e.ah.lpPin, e.ah.metaPin, e.ah.mtpPin = nil, nil, nil, [2][]byte{}, nil
	return errs
}

// AheadOK implements engine.Ahead: a decode step, pipelining on, not a
// profiled step (ProfileStep times the step's own runs).
func (c *compute) AheadOK(mtp bool) bool {
	return c.step && !c.e.ah.off && (!mtp || c.e.ah.mtp) && !c.e.graphs.hold && c.e.graphs.keep == nil
}

// takeAhead says whether rows are the forward started ahead, consuming it;
// any other forward discards it.
func (e *backend) takeAhead(rs []engine.Row, logits []bool) bool {
	ah := e.ah.rows
	e.ah.rows = nil
	if ah == nil || logits != nil || len(rs) != len(ah) {
		return false
	}
	if e.ah.loose {
		e.ah.taken++
		return true
	}
	for i, r := range rs {
		if e.slots[r.Slot] != ah[i].s || r.Tok != ah[i].tok || r.Pos != ah[i].pos {
			return false
		}
	}
	e.ah.taken++
	return true
}

// PickAhead implements engine.Ahead.
func (c *compute) PickAhead(picks []engine.Pick, next []engine.Row, from []int) ([]int, error) {
	e, o := c.e, c.o
	if o.err != nil {
		return nil, o.err
	}
	e.dropAhead()
	n := len(picks)
	if len(from) != len(next) || n > e.maxRows {
		return nil, errors.Newf("pick ahead: %d picks, %d next rows, %d sources", n, len(next), len(from))
	}
	for i, j := range from {
		if j >= n {
			return nil, errors.Newf("pick ahead: next row %d takes pick %d of %d", i, j, n)
		}
	}
	reqs := make([]pickReq, n)
	for i, p := range picks {
		reqs[i] = pickReq{row: p.Row, p: p.Params, pos: p.Pos, adjust: p.Adjust, lp: p.LP, topLP: p.TopLP}
		if p.Adjust != nil || p.LP != nil {
			e.ah.adjusted++
		}
	}
	if err := e.aheadPins(o.b); err != nil {
		return nil, err
	}
	// Penalties, bad words, a thinking budget: their entries go up with
	// the step (a stream-ordered copy) and change the rows before the pick;
	// logprobs are computed behind it and come back with the ids.
	lpRow, err := e.adjustForPick(o, reqs)
	if err != nil {
		return nil, err
	}
	e.choose(o, reqs)
	e.queueLogprobs(o, reqs, lpRow)
	if o.err != nil {
		return nil, o.err
	}
	pin := e.ah.tokPin[:4*n]
	wait, err := o.b.downloadAsync(pin, e.ws.tok)
	if err != nil {
		return nil, err
	}
	var lpb [3][]byte // logprobs, top ids, top logprobs: e.ah.lpPin's parts
	if m := len(lpRow); m > 0 {
		K := kernels.MaxTopLogprobs
		lpb = [3][]byte{e.ah.lpPin[:4*m], e.ah.lpPin[4*e.maxRows:][:4*m*K], e.ah.lpPin[4*e.maxRows*(1+K):][:4*m*K]}
		for k, src := range []cuda.DevPtr{e.lpw.lp, e.lpw.topID, e.lpw.topLP} {
			// One event marks the copies' end: the last one's wait covers them.
			if wait, err = o.b.downloadAsync(lpb[k], src); err != nil {
				return nil, err
			}
		}
	}
	rows := c.rows(next)
	meta := e.ah.metaPin[e.ah.k]
	e.ah.k ^= 1
	e.forwardFrom(e.beginMeta(o, rows, meta, from), false, nil)
	o.do(o.b.launchQueued())
	// Wait for the ids even after an error: pin must not be rewritten
	// while the copy may still run.
	werr := wait()
	if o.err != nil || werr != nil {
		return nil, errors.CombineErrors(o.err, werr)
	}
	toks, err := e.tokensOf(pin, n)
	if err != nil {
		return nil, err
	}
	if len(lpRow) > 0 {
		fillLogprobs(reqs, lpRow, lpb[0], lpb[1], lpb[2])
	}
	for i, j := range from {
		if j >= 0 {
			rows[i].tok = toks[j]
		}
	}
	e.ah.rows = rows
	e.ah.started++
	c.ahead = true
	return toks, nil
}
