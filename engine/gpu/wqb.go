package gpu

import (
	"os"

	"github.com/tilert-go/tilert/cuda/kernels"
	"github.com/tilert-go/tilert/model"
)

// wqbStageOn: a one-row step's indexer wq_b runs on the staged GEMV
// (kernels' tile plan _st, cu/gemv_stage.cu): its blocks copy their share of
// the weights into shared memory before their PDL wait, and then only the
// sums remain. One H100, 9 MoE layers, A/B/A/B (docs/measured/h100-2026-12-06-s53):
// GLM-5 dims 8192 -28 / -26 and -24 / -21 us a step, 131072 -8 / -6;
// DeepSeek-V3.2 dims 8192 -3 / -6, 131072 -19 / -18. On DeepSeek-V3.2 dims the
// outputs are the default tile plan's bit for bit (G32/R8); GLM-5 dims' sum
// in another order (float32). TILERT_GPU_WQB_STAGE=0 keeps the tile rule; a
// TILERT_GPU_TILE_PLANS pin of the shape wins over this one. Read at each
// engine's start (tests flip it).
func wqbStageOn() bool { return os.Getenv("TILERT_GPU_WQB_STAGE") != "0" }

// wqbStagePlan is the staged GEMV's one plan.
var wqbStagePlan = kernels.TilePlan{G: 32, R: 8, V: kernels.StageVariant}

// wqbShape is the indexer wq_b's [rows, K] in cfg (zero: no indexer).
func wqbShape(cfg *model.Config) [2]int {
	if cfg.IndexNHeads == 0 || cfg.IndexHeadDim == 0 || cfg.QLoraRank == 0 {
		return [2]int{}
	}
	return [2]int{cfg.IndexNHeads * cfg.IndexHeadDim, cfg.QLoraRank}
}

// wqbPin gives a CUDA runner wq_b's shape to pin to the staged GEMV
// (readyModules), where the switch is on.
func wqbPin(r runner, cfg *model.Config) {
	if cr, ok := r.(*cudaRunner); ok && wqbStageOn() {
		cr.wqb = wqbShape(cfg)
	}
}
