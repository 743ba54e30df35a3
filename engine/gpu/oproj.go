package gpu

import (
	"log/slog"
	"os"
	"strings"

	"github.com/cockroachdb/errors"

	"github.com/tilert-go/tilert/cuda/kernels"
	"github.com/tilert-go/tilert/model"
)

// oprojPlan: TILERT_GPU_OPROJ=<plan> (kernels.TilePlan's text, e.g.
// G64/R8_d16s/B0) launches o_proj's one-row GEMV with that tile plan instead
// of tileShape's (G64/R8_d16 at both models' shapes); =0 keeps tileShape's.
// Unset (oprojAuto): kernels.Set.SpreadPlan, which deals the row tiles out
// where that cuts the busiest SM's rows by a fifth (GLM-5's o_proj; not
// DeepSeek-V3.2's). Why (cuda/kernels/NOTES.md "o_proj's tail"): 32-row
// blocks leave some SMs twice the rows of others, and an SM streams at
// about its share of the copy rate however little the others have left. A
// plan with tileShape's G keeps every output bit (TestKernelTilePlanBitwise);
// another G sums in another order.
var (
	oprojEnv                = strings.TrimSpace(os.Getenv("TILERT_GPU_OPROJ"))
	oprojAuto               = oprojEnv == ""
	oprojPlan, oprojPlanErr = kernels.ParseTilePlan(oprojEnv)
)

// oprojShape is o_proj's [rows, K] in cfg: the shape the plan is pinned to
// (a launch of it with more than one row keeps tileShape's choice).
func oprojShape(cfg *model.Config) [2]int {
	return [2]int{cfg.HiddenSize, cfg.NumHeads * cfg.VHeadDim}
}

// oprojPin gives the runner o_proj's shape to pin (readyModules), where
// TILERT_GPU_OPROJ names a plan.
func oprojPin(r runner, cfg *model.Config) error {
	if oprojPlanErr != nil {
		return errors.Wrap(oprojPlanErr, "TILERT_GPU_OPROJ")
	}
	cr, ok := r.(*cudaRunner)
	if !ok || (!oprojAuto && !oprojPlan.On()) {
		return nil
	}
	cr.oproj = oprojShape(cfg)
	if !oprojAuto {
		slog.Info("TILERT_GPU_OPROJ: o_proj's one-row GEMV on a pinned tile plan", "plan", oprojPlan.String(),
			"rows", cr.oproj[0], "k", cr.oproj[1])
	}
	return nil
}

// oprojFor is the plan o_proj's shape gets on k: TILERT_GPU_OPROJ's, or
// unset, SpreadPlan's (the zero plan: tileShape's launch).
func oprojFor(k *kernels.Set, shape [2]int) kernels.TilePlan {
	if oprojAuto {
		return k.SpreadPlan(shape[0], shape[1])
	}
	return oprojPlan
}
