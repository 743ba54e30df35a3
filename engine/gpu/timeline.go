package gpu

import (
	"sort"

	"github.com/cockroachdb/errors"

	"github.com/tilert-go/tilert/cuda/cupti"
)

// kernelTracer is what traceRuns needs of cupti.Tracer.
type kernelTracer interface {
	Start() error
	Stop() ([]cupti.KernelRecord, error)
}

// TimelineStep runs one Step over ids, then replays the device work that
// step queued as graphs with CUPTI's kernel trace on, and returns the
// kernels of the traced replay as the GPU ran them (by start; side streams
// and graph branches overlap). The runs are replayed warm times first,
// untraced in the result. A diagnostic (GPU only, libcupti needed): like
// ProfileStep, the replays rewrite the slots' latest cache entries, so
// release the slots afterwards. Nothing of CUPTI is loaded until the first
// call.
func (g *Engine) TimelineStep(ids []int, warm int) ([]cupti.KernelRecord, error) {
	tr, err := cupti.Open()
	if err != nil {
		return nil, err
	}
	e := g.m
	runs, err := g.stepRuns(ids)
	if err != nil {
		return nil, err
	}
	var recs []cupti.KernelRecord
	err = e.r.run(func(b device) error {
		cb, ok := b.(*cudaDevice)
		if !ok {
			return errors.New("TimelineStep needs the GPU backend")
		}
		var err error
		recs, err = traceRuns(tr, cudaGrapher{cb}, b, runs, warm, func() error { return cb.c.SyncStream(cb.s) })
		return err
	})
	return recs, err
}

// traceRuns captures each run as a graph with the tracer on (CUPTI then
// sees the graphs made: graphs instantiated before CUPTI first attached
// are the case its users report trouble with), replays them all warm
// times, waits, and replays them once more. Every replay runs the same
// kernels, so the records are warm+1 equal shares and the last share by
// start time (after the wait) is the traced step's; a count that does not
// split evenly is an error (records lost or foreign). The tracer is
// stopped on every path.
func traceRuns(tr kernelTracer, gr grapher, b device, runs [][]gop, warm int, sync func() error) ([]cupti.KernelRecord, error) {
	if len(runs) == 0 {
		return nil, errors.New("timeline: the step queued no device work")
	}
	if err := tr.Start(); err != nil {
		return nil, err
	}
	var xs []graphExec
	reps := max(warm, 1) + 1
	err := func() error {
		for _, run := range runs {
			x, err := captureOps(gr, b, run)
			if err != nil {
				return errors.Wrap(err, "timeline: capturing the step's runs")
			}
			xs = append(xs, x)
		}
		launchAll := func() error {
			for _, x := range xs {
				if err := gr.launch(x); err != nil {
					return err
				}
			}
			return nil
		}
		for range reps - 1 {
			if err := launchAll(); err != nil {
				return err
			}
		}
		// The wait puts the traced replay after every warm kernel.
		if err := sync(); err != nil {
			return err
		}
		if err := launchAll(); err != nil {
			return err
		}
		return sync()
	}()
	recs, serr := tr.Stop()
	for _, x := range xs {
		err = errors.CombineErrors(err, gr.destroy(x))
	}
	if err = errors.CombineErrors(err, serr); err != nil {
		return nil, err
	}
	if len(recs) == 0 || len(recs)%reps != 0 {
		return nil, errors.WithHint(errors.Newf("timeline: CUPTI recorded %d kernels over %d replays of the same graphs: not the same number each", len(recs), reps),
			"check that no other profiler (nsys, ncu) holds CUPTI and that nothing else runs on the GPU")
	}
	sort.SliceStable(recs, func(i, j int) bool { return recs[i].Start < recs[j].Start })
	return recs[len(recs)-len(recs)/reps:], nil
}
