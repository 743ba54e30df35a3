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
// A pin here wins over o_proj's for the same shape. eNxK pins the routed
// experts' one-row down launches of N rows of K a slot, pNxK their paired
// gate/up (N rows each), e.g. e7168x2048=G64/R8_d16/B0: the grid keeps the
// launch's rule over its slots, B capping its blocks an SM (session 30).
// Unset: nothing pinned.
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
		kind, dims := 0, shape // a dense GEMV; kernels.PlanExperts / PlanPair: the routed experts' launches
		switch {
		case strings.HasPrefix(shape, "e"):
			kind, dims = kernels.PlanExperts, shape[1:]
		case strings.HasPrefix(shape, "p"):
			kind, dims = kernels.PlanPair, shape[1:]
		}
		if ok {
			ns, ks, _ := strings.Cut(dims, "x")
			var en, ek error
			n, en = strconv.Atoi(ns)
			k, ek = strconv.Atoi(ks)
			ok = en == nil && ek == nil && n > 0 && k > 0 && n < kernels.PlanExperts
		}
		if !ok {
			return nil, errors.WithHint(errors.Newf("TILERT_GPU_TILE_PLANS=%q: %q is not NxK=PLAN", v, part),
				"write each pin as rows x K of the weight and a plan, e.g. 16384x2048=G64/R8_d16/B0 (e7168x2048=... the routed experts' down, p2048x7168=... their gate/up), comma-separated")
		}
		p, err := kernels.ParseTilePlan(plan)
		if err != nil {
			return nil, errors.Wrapf(err, "TILERT_GPU_TILE_PLANS: %s", shape)
		}
		if !p.On() {
			return nil, errors.WithHint(errors.Newf("TILERT_GPU_TILE_PLANS=%q: %s has no plan", v, shape),
				"drop that pin: a shape not named keeps its default launch")
		}
		if kind != 0 && (p.V == "_d16s" || p.V == kernels.StageVariant || kind == kernels.PlanPair && p.R < 2) {
			return nil, errors.WithHint(errors.Newf("TILERT_GPU_TILE_PLANS=%q: %s=%s is not a plan for the routed experts", v, shape, plan),
				"the experts' launches take G/R[_d16|_o4]/B plans (not _d16s or _st), and their paired gate/up (p) R >= 2")
		}
		if _, dup := pins[[2]int{n | kind, k}]; dup {
			return nil, errors.WithHint(errors.Newf("TILERT_GPU_TILE_PLANS=%q: %s pinned twice", v, shape),
				"name each shape once")
		}
		pins[[2]int{n | kind, k}] = p
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
		what := "dense"
		switch {
		case shape[0]&kernels.PlanPair != 0:
			what = "routed experts' gate/up"
		case shape[0]&kernels.PlanExperts != 0:
			what = "routed experts' down"
		}
		slog.Info("TILERT_GPU_TILE_PLANS: a one-row GEMV shape on a pinned tile plan", "launch", what,
			"rows", shape[0]&(kernels.PlanExperts-1), "k", shape[1], "plan", p.String())
	}
	return nil
}
