package gpu

import (
	"log/slog"
	"os"
	"strconv"
	"strings"

	"github.com/cockroachdb/errors"

	"github.com/tilert-go/tilert/cuda/kernels"
)

// TILERT_GPU_TILE_PLANS=NxK=PLAN[,NxK=PLAN...] pins the one-row fp8 tile
// GEMVs of N rows of K to a kernels.TilePlan each (the text the timing
// sweeps print, e.g. 16384x2048=G64/R8_d16/B0), as TILERT_GPU_OPROJ does
// o_proj's, for any shape: experiments on the decode step without new
// code (a q_b on another variant beside the indexer, GLM-5's dense down
// spread over the SMs). A plan with the shape's default G keeps every
// output bit (TestKernelTilePlanBitwise); another G sums in another order.
// A pin here wins over o_proj's for the same shape. Unset: nothing pinned.
var tilePlansSet, tilePlansErr = parseTilePlans(os.Getenv("TILERT_GPU_TILE_PLANS"))

func parseTilePlans(v string) (map[[2]int]kernels.TilePlan, error) {
	if strings.TrimSpace(v) == "" {
		return nil, nil
	}
	pins := map[[2]int]kernels.TilePlan{}
	for _, part := range strings.Split(v, ",") {
		part = strings.TrimSpace(part)
		shape, plan, ok := strings.Cut(part, "=")
		n, k := 0, 0
		if ok {
			ns, ks, _ := strings.Cut(shape, "x")
			var en, ek error
			n, en = strconv.Atoi(ns)
			k, ek = strconv.Atoi(ks)
			ok = en == nil && ek == nil && n > 0 && k > 0
		}
		if !ok {
			return nil, errors.WithHint(errors.Newf("TILERT_GPU_TILE_PLANS=%q: %q is not NxK=PLAN", v, part),
				"write each pin as rows x K of the weight and a plan, e.g. 16384x2048=G64/R8_d16/B0, comma-separated")
		}
		p, err := kernels.ParseTilePlan(plan)
		if err != nil {
			return nil, errors.Wrapf(err, "TILERT_GPU_TILE_PLANS: %s", shape)
		}
		if !p.On() {
			return nil, errors.WithHint(errors.Newf("TILERT_GPU_TILE_PLANS=%q: %s has no plan", v, shape),
				"drop that pin: a shape not named keeps its default launch")
		}
		if _, dup := pins[[2]int{n, k}]; dup {
			return nil, errors.WithHint(errors.Newf("TILERT_GPU_TILE_PLANS=%q: %s pinned twice", v, shape),
				"name each shape once")
		}
		pins[[2]int{n, k}] = p
	}
	return pins, nil
}

// tilePlansPin gives a CUDA runner TILERT_GPU_TILE_PLANS's pins
// (readyModules sets them after o_proj's), or refuses a value that did not
// parse.
func tilePlansPin(r runner) error {
	if tilePlansErr != nil {
		return tilePlansErr
	}
	cr, ok := r.(*cudaRunner)
	if !ok {
		return nil
	}
	cr.plans = tilePlansSet
	for shape, p := range cr.plans {
		slog.Info("TILERT_GPU_TILE_PLANS: a one-row GEMV shape on a pinned tile plan", "rows", shape[0], "k", shape[1], "plan", p.String())
	}
	return nil
}
