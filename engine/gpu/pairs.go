package gpu

import (
	"os"

	"github.com/cockroachdb/errors"

	"github.com/tilert-go/tilert/cuda"
	"github.com/tilert-go/tilert/cuda/kernels"
	"github.com/tilert-go/tilert/engine"
)

// mtpPairsOn: TILERT_GPU_MTP_PAIRS=1 runs a pipelined MTP step's MTP layer
// over both candidate rows of every slot, launched behind the verify's
// picks before they reach the host (engine.PairsAhead). Without it the host
// waits for the picks, decides acceptance and only then records and
// launches the MTP forward over the rows it chose: the one round trip left
// in a pipelined MTP step (session 46: ~80 us a step on an H100, the
// bench's p50 against the traced replay of the step's graphs).
//
// A verify step forwards a pair of rows a slot: its token (row 2i) and its
// draft (row 2i+1). The MTP row at the token's position is needed whatever
// the verify picks; the row one position on only where the draft is
// accepted. Both rows' tokens are picks on the device and their positions
// and hidden rows are known before the picks are, so the MTP forward over
// every pair can be launched at once: mtp_pair_select makes row 2i+1 a copy
// of row 2i where the pick of row 2i is not the draft, so that the rejected
// draft's row routes to its pair's experts and reads no weights of its
// own. Its cache entry one position on is written by the next step's MTP
// row there before anything reads it. The host picks each slot's draft
// from the row it needs once the verify's picks are in.
var mtpPairsOn = os.Getenv("TILERT_GPU_MTP_PAIRS") == "1"

// mtpPairsBroken (tests only) makes the emulator's mtp_pair_select take
// row 2i for every MTP row 2i+1, so that a test can show it would see a
// wrong selection.
var mtpPairsBroken bool

// PairsOK implements engine.PairsAhead.
func (c *compute) PairsOK() bool { return mtpPairsOn && c.AheadOK(true) }

// PickPairs implements engine.PairsAhead: the verify's picks queued and
// their ids copied to the host beside the main stream, then the MTP
// forward over every pair (all rows' logits), launched before the host
// waits for the ids.
func (c *compute) PickPairs(picks []engine.Pick, mrows []engine.Row, drafts []int) ([]int, error) {
	e, o := c.e, c.o
	if o.err != nil {
		return nil, o.err
	}
	e.dropAhead()
	n, P := len(picks), len(drafts)
	if P == 0 || n != 2*P || len(mrows) != n || n > e.maxRows {
		return nil, errors.Newf("pick pairs: %d picks, %d MTP rows, %d drafts (two rows a draft)", n, len(mrows), P)
	}
	reqs := make([]pickReq, n)
	for i, p := range picks {
		if p.Row != i {
			return nil, errors.Newf("pick pairs: pick %d is of row %d (one pick a row, in order)", i, p.Row)
		}
		reqs[i] = pickReq{row: p.Row, p: p.Params, pos: p.Pos, adjust: p.Adjust, lp: p.LP, topLP: p.TopLP}
	}
	for i := range P {
		a, b := mrows[2*i], mrows[2*i+1]
		if a.Slot != b.Slot || b.Pos != a.Pos+1 {
			return nil, errors.Newf("pick pairs: MTP rows %d and %d are not one slot's consecutive positions", 2*i, 2*i+1)
		}
	}
	if err := e.aheadPins(o.b); err != nil {
		return nil, err
	}
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
	var lpb [3][]byte
	if m := len(lpRow); m > 0 {
		K := kernels.MaxTopLogprobs
		lpb = [3][]byte{e.ah.lpPin[:4*m], e.ah.lpPin[4*e.maxRows:][:4*m*K], e.ah.lpPin[4*e.maxRows*(1+K):][:4*m*K]}
		for k, src := range []cuda.DevPtr{e.lpw.lp, e.lpw.topID, e.lpw.topLP} {
			if wait, err = o.b.downloadAsync(lpb[k], src); err != nil {
				return nil, err
			}
		}
	}
	// The meta carries each pair's draft at its second row (row 2i's id is
	// written on the device); mtp_pair_select reads it before the picks
	// replace it, then fills ws.hin, which ForwardMTP's gather would.
	rows := c.rows(mrows)
	for i, d := range drafts {
		rows[2*i].tok, rows[2*i+1].tok = 0, d
	}
	if f := e.begin(o, rows); f != nil {
		o.do(o.b.mtpPairSelect(f.ids, e.ws.hin, e.ws.tok, e.ws.hid, P, e.cfg.HiddenSize))
		e.forwardFrom(f, true, nil)
	}
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
	e.ah.pairs++
	c.ahead = true
	return toks, nil
}
