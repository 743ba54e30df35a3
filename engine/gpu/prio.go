package gpu

import (
	"os"

	"github.com/cockroachdb/errors"

	"github.com/tilert-go/tilert/cuda"
)

// TILERT_GPU_MAIN_PRIO=1 (opt-in, session 27, NOT RUN on a GPU yet) puts
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
var mainPrioOn, mainPrioErr = parseMainPrio(os.Getenv("TILERT_GPU_MAIN_PRIO"))

func parseMainPrio(v string) (bool, error) {
	switch v {
	case "", "0":
		return false, nil
	case "1":
		return true, nil
	}
	return false, errors.WithHint(errors.Newf("TILERT_GPU_MAIN_PRIO=%q is not 0 or 1", v),
		"set TILERT_GPU_MAIN_PRIO=1 to run the step's main stream at the device's greatest priority (side streams at the default), or unset it")
}

// prioPin gives a whole-model CUDA runner, where TILERT_GPU_MAIN_PRIO is
// on, a stream of its own at the device's greatest priority (its context's
// stays as it was: other engines may share the device). A sharded rank's
// runner (wrapped, or on a stream of its own already) keeps its stream,
// like sidePin's rule: measured on whole models only.
func prioPin(r runner) error {
	cr, ok := r.(*cudaRunner)
	if !ok || !mainPrioOn || cr.stream != 0 || cr.dev == nil {
		return nil
	}
	return cr.dev.Do(func(c *cuda.Ctx) error {
		_, greatest, err := c.StreamPriorityRange()
		if err != nil {
			return errors.WithHint(err, "unset TILERT_GPU_MAIN_PRIO")
		}
		s, err := c.NewStreamWithPriority(greatest)
		if err != nil {
			return errors.WithHint(err, "unset TILERT_GPU_MAIN_PRIO")
		}
		cr.stream, cr.ownStream, cr.prio = s, true, true
		return nil
	})
}
