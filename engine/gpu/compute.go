package gpu

import (
	"github.com/tilert-go/tilert/engine"
)

// Run implements engine.Backend: f runs on the device thread; a decode step
// runs through the graph cache (graph.go).
func (e *backend) Run(step bool, f func(engine.Compute) error) error {
	if !step {
		if err := e.settle(); err != nil {
			return err
		}
	} else if err := e.ah.err; err != nil {
		e.ah.err = nil
		e.dropAhead()
		return err
	}
	run := e.r.runAhead
	switch {
	case step:
		run = e.runGraphed
	case e.prof != nil:
		run = e.runTimed
	}
	ahead := false
	err := run(func(b device) (bool, error) {
		c := &compute{e: e, o: &ops{b: b}, step: step}
		err := f(c)
		if err == nil {
			err = c.o.err
		}
		ahead = c.ahead && err == nil
		return ahead, err
	})
	// Without work left in flight the run ended with a sync.
	e.ah.inflight = ahead && err == nil
	if err != nil {
		e.dropAhead()
	}
	return err
}

// compute is engine.Compute for one device run: rows go through forward
// (forward.go), hidden states stay in the workspace (ws.hid) until kept.
type compute struct {
	e *backend
	o *ops
	// step: a decode step (Run(true, ...)); ahead: PickAhead left the next
	// step's forward in flight.
	step, ahead bool
}

func (c *compute) rows(rs []engine.Row) []fwdRow {
	out := make([]fwdRow, len(rs))
	for i, r := range rs {
		out[i] = fwdRow{s: c.e.slots[r.Slot], tok: r.Tok, pos: r.Pos}
	}
	return out
}

// Forward implements engine.Compute.
func (c *compute) Forward(rs []engine.Row, logits []bool) error {
	if c.e.takeAhead(rs, logits) && c.step {
		return nil // PickAhead of the last step ran it
	}
	c.e.forward(c.o, c.rows(rs), false, logits)
	return c.o.err
}

// KeepHidden implements engine.Compute.
func (c *compute) KeepHidden(slot, row int) error {
	c.e.dropAhead()
	c.o.copyRow(c.e.slots[slot].hidden, c.e.ws.hid, row, c.e.cfg.HiddenSize)
	return c.o.err
}

// ForwardMTP implements engine.Compute: the hidden inputs are gathered into
// ws.hin (runs of consecutive main rows in one copy).
func (c *compute) ForwardMTP(rs []engine.Row, hidden []int, logits []bool) error {
	e, o := c.e, c.o
	e.dropAhead()
	c.gatherMTPInput(rs, hidden)
	var pin []byte
	if mtpMetaPinOn {
		if err := e.aheadPins(o.b); err != nil {
			return err
		}
		pin = e.ah.mtpPin
	}
	e.forwardFrom(e.beginMeta(o, c.rows(rs), pin, nil), true, logits)
	return o.err
}

// gatherMTPInput copies each MTP row's hidden input into ws.hin: row
// hidden[j] of the last main forward, or its slot's kept hidden for -1.
func (c *compute) gatherMTPInput(rs []engine.Row, hidden []int) {
	H := c.e.cfg.HiddenSize
	ws := c.e.ws
	for j := 0; j < len(hidden); {
		if hidden[j] < 0 {
			c.o.do(c.o.b.copyDD(fptr(ws.hin, j*H), c.e.slots[rs[j].Slot].hidden, int64(4*H)))
			j++
			continue
		}
		k := j + 1
		for k < len(hidden) && hidden[k] == hidden[k-1]+1 {
			k++
		}
		c.o.do(c.o.b.copyDD(fptr(ws.hin, j*H), fptr(ws.hid, hidden[j]*H), int64(4*H*(k-j))))
		j = k
	}
}

// Pick implements engine.Compute on the device (arg-max or the device
// sampler); only the token ids come back.
func (c *compute) Pick(picks []engine.Pick) ([]int, error) {
	c.e.dropAhead()
	reqs := make([]pickReq, len(picks))
	for i, p := range picks {
		reqs[i] = pickReq{row: p.Row, p: p.Params, pos: p.Pos, adjust: p.Adjust, lp: p.LP, topLP: p.TopLP}
	}
	return c.e.pick(c.o, reqs)
}
