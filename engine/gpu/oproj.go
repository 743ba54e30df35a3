package gpu

import (
	"log/slog"
	"os"

	"github.com/cockroachdb/errors"

	"github.com/tilert-go/tilert/cuda/kernels"
	"github.com/tilert-go/tilert/model"
)

// oprojPlan: TILERT_GPU_OPROJ=<plan> (opt-in; kernels.TilePlan's text, e.g.
// G64/R8_d16s/B0) launches o_proj's one-row GEMV with that tile plan instead
// of tileShape's (G64/R8_d16 at both models' shapes). Why (cuda/kernels/
// NOTES.md "o_proj's tail"): its 7168 (GLM-5: 6144) rows in 32-row blocks
// leave some SMs twice the rows of others, and an SM streams at about its
// share of the copy rate however little the others have left. A plan with
// G64 keeps every output bit (TestKernelTilePlanBitwise); another G sums in
// another order.
var oprojPlan, oprojPlanErr = kernels.ParseTilePlan(os.Getenv("TILERT_GPU_OPROJ"))

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
	if !ok || !oprojPlan.On() {
		return nil
	}
	cr.oproj = oprojShape(cfg)
	slog.Info("TILERT_GPU_OPROJ: o_proj's one-row GEMV on a pinned tile plan", "plan", oprojPlan.String(),
		"rows", cr.oproj[0], "k", cr.oproj[1])
	return nil
}
