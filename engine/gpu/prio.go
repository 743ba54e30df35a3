package gpu

import (
	"os"

	"github.com/cockroachdb/errors"

	"github.com/tilert-go/tilert/cuda"
	"github.com/tilert-go/tilert/cuda/kernels"
)

// TILERT_GPU_MAIN_PRIO=1 (opt-in, session 27; measured in session 28) puts
// a whole-model engine's stream at the device's greatest scheduling
// priority, the side streams (side.go) staying at the default, the least,
// and instantiates the step's graphs with their kernel nodes' own
// priorities. Why: the side chains' weight streams are capped at a block
// an SM (sideCap) so that the latency-bound main chain finds room, a static
// guess that either starves the side GEMV or, uncapped, the main chain.
// Session 27's traces at 131072 (docs/measured/h200-2026-12-04-s27) show
// the latter: with q_b forked before the scores and uncapped, the top-k's
// 1024-thread blocks (half an SM's registers) become resident only ~9 us
// after the scores end, once q_b's queued blocks run out; capped, q_b ends
// later by as much. A priority lets the block scheduler place the main
// chain's waiting blocks first as room frees up and the side stream fill
// the rest, with no cap. Session 11 measured a launch priority "changing
// nothing", but its graphs were instantiated without
// CUDA_GRAPH_INSTANTIATE_FLAG_USE_NODE_PRIORITY, so every node replayed at
// the launching stream's priority: that run never tested priorities.
//
// Measured (session 28, docs/measured/h200-2026-12-04-s28, 9 MoE layers,
// 1 slot, p50): slower on every row, +50..+66 us a step (DeepSeek-V3.2
// dims 2.732 / 2.838 ms at 8192 / 131072 against 2.666 / 2.777; GLM-5
// dims 2.748 / 2.877 against 2.694 / 2.828). The trace at 8192 shows why:
// the attention front ends where it did, but the MoE's shared expert runs
// on the side stream too, and its down GEMV, starved by the routed
// experts' raised blocks, now ends after them (+6.9 us a layer). Hence
// TILERT_GPU_MAIN_PRIO=q: the shared expert's side stream raised with the
// main one, only the q chain's at the least. It loses too (+7..+19 us),
// except with the q chain uncapped on DeepSeek-V3.2 dims at 8192, where
// the priority stands in for its cap: 2.632 / 2.633 against 2.658 / 2.663
// (a lead, engine/gpu/NOTES.md).
var mainPrio, mainPrioErr = parseMainPrio(os.Getenv("TILERT_GPU_MAIN_PRIO"))

// prioMode is TILERT_GPU_MAIN_PRIO: which streams run at the device's
// greatest priority.
type prioMode int

const (
	prioOff  prioMode = iota // every stream at the default
	prioMain                 // "1": the main stream; both side chains' stream at the least
	prioQLow                 // "q": the main stream and the shared expert's; the q chain's at the least, uncapped
	prioAuto                 // "auto": prioQLow where q_b is _d16 (its q chain capped by default), else off
)

func parseMainPrio(v string) (prioMode, error) {
	switch v {
	case "", "0":
		return prioOff, nil
	case "1":
		return prioMain, nil
	case "q":
		return prioQLow, nil
	case "auto":
		return prioAuto, nil
	}
	return prioOff, errors.WithHint(errors.Newf("TILERT_GPU_MAIN_PRIO=%q is not 0, 1, q or auto", v),
		"set TILERT_GPU_MAIN_PRIO=1 to run the step's main stream at the device's greatest priority (side streams at the default), =q to raise the shared expert's side stream with it and uncap the q chain, =auto for q where q_b is a _d16 launch, or unset it")
}

// prioFor is the mode a runner takes: auto resolves by q_b's one-row tile
// variant (qbVariant, "" without one). "q" stands the priority in for the
// q chain's cap, which only a _d16 q_b has at q_a (sideOpen); GLM-5's _o4
// q_b is uncapped already, and the priority alone costs it (+6 us at 8192,
// session 28 call E).
func prioFor(m prioMode, qbVariant string) prioMode {
	if m != prioAuto {
		return m
	}
	if qbVariant == "_d16" {
		return prioQLow
	}
	return prioOff
}

// prioPin gives a whole-model CUDA runner, where TILERT_GPU_MAIN_PRIO is
// on, a stream of its own at the device's greatest priority (its context's
// stays as it was: other engines may share the device), and with "q" a
// second side stream at that priority for the shared expert (created on
// first use, side.go). A sharded rank's
// runner (wrapped, or on a stream of its own already) keeps its stream,
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
		_, greatest, err := c.StreamPriorityRange()
		if err != nil {
			return errors.WithHint(err, "unset TILERT_GPU_MAIN_PRIO")
		}
		s, err := c.NewStreamWithPriority(greatest)
		if err != nil {
			return errors.WithHint(err, "unset TILERT_GPU_MAIN_PRIO")
		}
		cr.stream, cr.ownStream, cr.prio = s, true, true
		if mode == prioQLow {
			cr.sideSh = sideStream{raised: true, prio: greatest}
		}
		return nil
	})
}
