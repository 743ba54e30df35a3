package gpu

import (
	"os"

	"github.com/cockroachdb/errors"

	"github.com/tilert-go/tilert/cuda"
	"github.com/tilert-go/tilert/cuda/kernels"
)

// TILERT_GPU_MAIN_PRIO: launch priorities. When blocks of several grids
// wait for room on the SMs, the block scheduler places those of the
// higher priority first (a resident block is never preempted). The side
// chains' weight streams (side.go) are otherwise capped at a block an SM
// so that the latency-bound main chain finds room: a static guess that
// either starves the side GEMV or, uncapped, the main chain. A priority
// lets the scheduler choose per free slot instead.
//
// Since session 29 the priority is a launch attribute (kernels.Set
// SetPriority), decided per step, not a stream's: each captured kernel
// node keeps its own, and the graphs are instantiated with the nodes'
// priorities. Sessions 27-28 raised whole streams (the code last at
// 377a10d), which could not tell a one-row step from a four-row one.
//
// Measured (9 MoE layers, p50 ms, docs/measured/h200-2026-12-04-s28 and
// -s29):
//   - "1", every step's main chain raised, both side chains not: slower on
//     every row, +50..+66 us a step. The MoE's shared expert also runs on
//     the side stream, and its down GEMV, starved by the routed experts'
//     raised blocks, ends after them (+6.9 us a layer, session 28's trace).
//   - "q", the shared expert raised too, only the q chain not, and that
//     chain uncapped at q_a (the priority stands in for its cap): on
//     DeepSeek-V3.2 dims (q_b a _d16 launch), one slot, 8192: 2.626 / 2.624
//     against 2.649 / 2.648 (session 29, and 2.632 / 2.633 against 2.658 /
//     2.663 in session 28); at 131072, where the q chain forks late, +8 us;
//     at four slots +34 us (8192) and +70 us (131072); on GLM-5 dims, whose
//     _o4 q chain is uncapped already, +6 us at 8192.
//     At two slots (two rows, the q chain capped at a block an SM either
//     way): 8192 -9..-15 us (four pairs), 131072 +31 / +40 us; MTP's
//     verify steps (two rows) even within their noise (±100 us, six pairs).
//   - "auto" (the default): "q" in the steps where it won, on a _d16 q_b:
//     those of one or two rows within 32768 keys whose q chain forks at
//     q_a; elsewhere nothing is raised, and the q chain keeps its cap
//     (side.go cudaDevice.sideCap). Until session 44 a one-row step was
//     raised at any length: since session 42 forks the q chain at q_a at
//     131072 too, raising it there cost DeepSeek-V3.2 dims (1 dense + 3
//     MoE layers, one H100, A/B/A/B against =0) +9 / +12 and +10 / +9 us
//     at 131072, +4 / +6 at 65536, +5 / +6 at 32768, while it still won
//     at 24576 (-20 / -17) and 8192 (-12 / -12, -11 / -8); GLM-5 dims
//     (_o4: never raised) are unmoved.
var mainPrio, mainPrioErr = parseMainPrio(os.Getenv("TILERT_GPU_MAIN_PRIO"))

// prioMode is TILERT_GPU_MAIN_PRIO, resolved per runner by prioFor.
type prioMode int

const (
	prioOff  prioMode = iota // nothing raised
	prioMain                 // "1": every step's main chain; neither side chain
	prioQLow                 // "q": every step's main chain and shared expert; the q chain neither, uncapped at q_a
	prioAuto                 // "auto": prioQLow where q_b is _d16, in the steps stepRaised says
)

func (m prioMode) String() string {
	return [...]string{"off", "1", "q", "auto"}[m]
}

func parseMainPrio(v string) (prioMode, error) {
	switch v {
	case "", "auto":
		return prioAuto, nil
	case "0":
		return prioOff, nil
	case "1":
		return prioMain, nil
	case "q":
		return prioQLow, nil
	}
	return prioOff, errors.WithHint(errors.Newf("TILERT_GPU_MAIN_PRIO=%q is not auto, 0, 1 or q", v),
		"unset it (auto: the step's launches raised where measured faster), or set 0 to raise nothing, 1 to raise every step's main chain, q to raise the shared expert's launches with it and uncap the q chain")
}

// prioFor is the mode a runner takes: auto stays where q_b's one-row tile
// variant (qbVariant, "" without one) is _d16, the q chain capped by
// default, and is off elsewhere: GLM-5's _o4 q_b is uncapped already, and
// the priority alone costs it (+6 us at 8192, session 28 call E).
func prioFor(m prioMode, qbVariant string) prioMode {
	if m == prioAuto && qbVariant != "_d16" {
		return prioOff
	}
	return m
}

// stepRaised says whether a step of rows rows runs its main chain at the
// greatest priority under the runner's mode m: late, its q chain forks
// after the indexer's scores (qLate); long, some row is over 32768 keys
// (fwd.long: its top-k on the mark blocks).
func stepRaised(m prioMode, rows int, late, long bool) bool {
	switch m {
	case prioMain, prioQLow:
		return true
	case prioAuto:
		return !late && rows <= 2 && !long
	}
	return false
}

// chainRaised says whether side chain ch keeps a raised step's priority.
func chainRaised(m prioMode, ch sideChain) bool {
	return ch == chainSh && (m == prioQLow || m == prioAuto)
}

// qUncapped says whether mode m uncaps the q chain forked at q_a in a
// one-row step (sideOpen) that runs raised or not: its priority below the
// main chain's stands in for the cap, so only in a raised step. A step
// auto leaves at the stream's priority (a long one-row step, stepRaised)
// keeps the caps of the priorities off, the form its A/B measured
// (session 44).
func qUncapped(m prioMode, raised bool) bool { return raised && (m == prioQLow || m == prioAuto) }

// prioPin resolves TILERT_GPU_MAIN_PRIO for a whole-model CUDA runner and
// reads the device's greatest priority. A sharded rank's runner (wrapped,
// or on a stream of its own) keeps every launch at its stream's priority,
// like sidePin's rule: measured on whole models only.
func prioPin(r runner) error {
	cr, ok := r.(*cudaRunner)
	if !ok || mainPrio == prioOff || cr.stream != 0 || cr.dev == nil {
		return nil
	}
	return cr.dev.Do(func(c *cuda.Ctx) error {
		mode := mainPrio
		if mode == prioAuto {
			v := ""
			if cr.qb != [2]int{} {
				k, err := kernels.Load(c)
				if err != nil {
					return err
				}
				v = k.TileVariantOf(cr.qb[0], cr.qb[1])
			}
			if mode = prioFor(mode, v); mode == prioOff {
				return nil
			}
		}
		least, greatest, err := c.StreamPriorityRange()
		if err != nil {
			return errors.WithHint(err, "set TILERT_GPU_MAIN_PRIO=0")
		}
		if greatest == least {
			return nil // one priority: nothing to raise
		}
		cr.prio, cr.prioHi = mode, greatest
		return nil
	})
}

// raise sets the priority of the launches that follow: the runner's
// greatest where on, else the stream's. The forward pass asks it at a
// step's start (stepRaised) and end, on the main chain; fork and unfork
// keep a side chain's (chainRaised).
func (b *cudaDevice) raise(on bool) error {
	if b.forked() != nil {
		return errors.AssertionFailedf("gpu: launch priority changed inside a fork")
	}
	b.raised = on && b.prio != prioOff
	b.k.SetPriority(b.launchPrio(b.raised))
	return nil
}

func (b *cudaDevice) launchPrio(on bool) int {
	if on {
		return b.prioHi
	}
	return 0
}

func (b *cudaDevice) prioMode() prioMode { return b.prio }

func (m *emuDevice) raise(bool) error   { return nil }
func (m *emuDevice) prioMode() prioMode { return emuPrio }

// emuPrio is the emulator's resolved mode (tests: the forward pass's
// raise calls are recorded in its graphs).
var emuPrio prioMode

func (gb *graphDevice) raise(on bool) error {
	name := "lower"
	if on {
		name = "raise"
	}
	return gb.rec(name, 0, func(b device) error { return b.raise(on) })
}
