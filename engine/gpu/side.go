package gpu

import (
	"os"

	"github.com/cockroachdb/errors"

	"github.com/tilert-go/tilert/cuda"
)

// A decode layer has chains of work that do not depend on each other: q_b
// and the query absorption beside the indexer's projection, scores and
// top-k; the shared expert beside the router and the routing. On one
// stream each short, latency-bound kernel leaves the HBM idle while it
// ramps up and drains; on two streams one chain's weights stream while the
// other chain's small kernels run. fork queues the calls that follow on a
// second stream (after everything queued so far), unfork returns to the
// main stream and join makes the main stream wait for the side's calls.
// Captured into a step's graph these are a fork and a join of its branches.
//
// TILERT_GPU_SIDE=1 turns both on, =q only the attention's fork, =moe only
// the shared expert's (opt-in: on the H200 both together gave 2.928 ms
// against one stream's ~2.95 at 8192, 1 slot, and 6.47 against ~6.36 at 4
// slots, docs/measured/h200-2026-12-02-s7). The emulator runs
// each side chain after the main chain it overlaps (sideLast): a chain
// that read what the other writes would then compute something else, so
// the emulated engine checks catch an ordering mistake that the GPU would
// only show as a rare race.
var sideQOn, sideShOn = sideMode(os.Getenv("TILERT_GPU_SIDE"))

// Two chains only overlap if the weight stream leaves the latency-bound
// chain room on the SMs: a tile GEMV's grid fills every SM (two blocks of
// 128 registers take all of an SM's registers), so the other stream's
// kernels wait for its last wave. TILERT_GPU_SIDE_PRIO=1 launches the main
// stream's calls between an unfork and its join (the chain the side work
// overlaps, the critical path) at the context's greatest priority, so
// their blocks take the first room a retiring side block leaves;
// TILERT_GPU_SIDE_CAP=B caps the side stream's tile GEMVs at B blocks per
// SM (kernels.SetTileCap: the same bits), leaving the rest of each SM to
// the main chain. Both only change scheduling; opt-in while measured.
var (
	sidePrioOn = os.Getenv("TILERT_GPU_SIDE_PRIO") == "1"
	sideCap    = envInt("TILERT_GPU_SIDE_CAP", 0)
)

func sideMode(v string) (q, sh bool) {
	switch v {
	case "1":
		return true, true
	case "q":
		return true, false
	case "moe":
		return false, true
	}
	return false, false
}

// sideStream is a runner's second stream and the events that order it
// against the main one (created on first use, on the device thread).
type sideStream struct {
	s          cuda.Stream
	fork, join cuda.Event
	main       cuda.Stream // the stream unfork returns to
	active     bool        // calls go to s
	pending    bool        // s has calls the main stream has not waited for
	cap        int         // the tile cap fork replaced (TILERT_GPU_SIDE_CAP)
}

func (sd *sideStream) ensure(c *cuda.Ctx) error {
	if sd.s != 0 {
		return nil
	}
	s, err := c.NewStream()
	if err != nil {
		return err
	}
	f, err := c.NewSyncEvent()
	if err != nil {
		return errors.CombineErrors(err, c.DestroyStream(s))
	}
	j, err := c.NewSyncEvent()
	if err != nil {
		return errors.CombineErrors(err, errors.CombineErrors(c.DestroyEvent(f), c.DestroyStream(s)))
	}
	sd.s, sd.fork, sd.join = s, f, j
	return nil
}

func (sd *sideStream) destroy(c *cuda.Ctx) error {
	if sd.s == 0 {
		return nil
	}
	err := errors.CombineErrors(c.DestroyEvent(sd.fork), c.DestroyEvent(sd.join))
	err = errors.CombineErrors(err, c.DestroyStream(sd.s))
	*sd = sideStream{}
	return err
}

func (b *cudaDevice) fork() error {
	sd := b.side
	if sd == nil {
		return nil // no second stream (a sharded phase): the calls stay in order
	}
	if sd.active {
		return errors.AssertionFailedf("gpu: fork inside a fork")
	}
	if err := sd.ensure(b.c); err != nil {
		return err
	}
	if err := b.c.Record(sd.fork, b.s); err != nil {
		return err
	}
	if err := b.c.WaitEvent(sd.s, sd.fork); err != nil {
		return err
	}
	sd.main, b.s, sd.active = b.s, sd.s, true
	b.c.SetLaunchPriority(0) // the side's calls: the default priority
	if sideCap > 0 {
		sd.cap = b.k.SetTileCap(sideCap)
	}
	return nil
}

// mainPriority is the scheduling priority of the main stream's calls that
// run beside side work (TILERT_GPU_SIDE_PRIO): the context's greatest.
func (b *cudaDevice) mainPriority() int {
	if !sidePrioOn {
		return 0
	}
	_, greatest, err := b.c.StreamPriorityRange()
	if err != nil {
		return 0
	}
	return greatest
}

func (b *cudaDevice) unfork() error {
	sd := b.side
	if sd == nil || !sd.active {
		return nil
	}
	b.s, sd.active = sd.main, false
	if sideCap > 0 {
		b.k.SetTileCap(sd.cap)
	}
	if err := b.c.Record(sd.join, sd.s); err != nil {
		return err
	}
	sd.pending = true
	b.c.SetLaunchPriority(b.mainPriority())
	return nil
}

func (b *cudaDevice) join() error {
	sd := b.side
	if sd == nil {
		return nil
	}
	if sd.active {
		if err := b.unfork(); err != nil {
			return err
		}
	}
	if !sd.pending {
		return nil
	}
	sd.pending = false
	b.c.SetLaunchPriority(0) // past the join nothing runs beside the main stream
	return b.c.WaitEvent(b.s, sd.join)
}

// settle ends a run with the main stream behind any side work (an error
// between fork and join leaves the side open).
func (b *cudaDevice) settle() error {
	if b.side == nil || (!b.side.active && !b.side.pending) {
		return nil
	}
	return b.join()
}

// The emulator runs in call order; graphDevice reorders its side chains
// (sideLast).
func (m *emuDevice) fork() error   { return nil }
func (m *emuDevice) unfork() error { return nil }
func (m *emuDevice) join() error   { return nil }

func (gb *graphDevice) fork() error {
	return gb.rec("fork", 0, func(b device) error { return b.fork() })
}

func (gb *graphDevice) unfork() error {
	return gb.rec("unfork", 0, func(b device) error { return b.unfork() })
}

func (gb *graphDevice) join() error {
	return gb.rec("join", 0, func(b device) error { return b.join() })
}

// ctl says whether op is a stream fork, unfork or join: no device work of
// its own (timing calls alone skips it).
func (op gop) ctl() bool { return op.name == "fork" || op.name == "unfork" || op.name == "join" }

// sideLast returns run with every side chain (the calls between a fork
// and its unfork) moved to its join, after the main chain it overlaps: the
// order the emulator runs. A fork without its unfork, or an unfork or join
// without a fork, is an error.
func sideLast(run []gop) ([]gop, error) {
	out := make([]gop, 0, len(run))
	var side []gop
	state := 0 // 0 main, 1 in a side chain, 2 side chain waiting for its join
	for _, op := range run {
		switch op.name {
		case "fork":
			if state != 0 {
				return nil, errors.AssertionFailedf("gpu: fork inside a fork")
			}
			state, side = 1, side[:0]
			continue
		case "unfork":
			if state != 1 {
				return nil, errors.AssertionFailedf("gpu: unfork without a fork")
			}
			state = 2
			continue
		case "join":
			if state != 2 {
				return nil, errors.AssertionFailedf("gpu: join without a fork and unfork")
			}
			out, state = append(out, side...), 0
			continue
		}
		if state == 1 {
			side = append(side, op)
		} else {
			out = append(out, op)
		}
	}
	if state != 0 {
		return nil, errors.AssertionFailedf("gpu: a side chain is not joined at the end of a run")
	}
	return out, nil
}
