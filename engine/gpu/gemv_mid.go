package gpu

import (
	"log/slog"
	"os"
	"sync"

	"github.com/tilert-go/tilert/cuda/kernels"
)

// TILERT_GPU_GEMV_MID=1 (opt-in; helper gmid, issue 10): the one-row
// attention-input projections of a decode step run on the gemv_mid_group
// kernels (cuda/kernels/cu/mid/gemv_mid.cu, a module of its own loaded on
// first use): the layer input's grouped
// launch (q_a, kv_a, indexer wk, weights_proj) and, after q_a's rmsnorm,
// q_b and the indexer's wq_b as one grouped launch (projGroup; mode 3's
// grouping) in place of two tile GEMVs. The kernels are the grouped
// launch's body with every thread's share of its rows in flight in one
// round (or fewer rows a block); each segment keeps its group size G, so
// every output is the default launches' bit for bit and the emulator, the
// goldens and every tolerance stand unchanged. Applies to one input row
// (decode of one slot without MTP); several rows take the default path.
// TILERT_GPU_GEMV_MID_SHAPE picks the variant (kernels.GroupMidShapes:
// r8_d16, the default; r4_d16, r4_o4, r2_o4) for a device sweep. Ignored
// with TILERT_GPU_GEMV_TILE=0 or TILERT_GPU_GROUP=0.
var (
	gemvMidOn    = os.Getenv("TILERT_GPU_GEMV_MID") == "1" && gemvTileOn
	gemvMidShape = midShape(os.Getenv("TILERT_GPU_GEMV_MID_SHAPE"))
	// gemvMidOnce: the switch's outcome is logged once a process.
	gemvMidOnce sync.Once
)

// gemvMidReady says whether the mid module (kernels.MidSupported) loads
// here; with the switch on, the runners call it before any capture. Where
// it does not, the default grouped kernels run (the same bits), said once
// in the log.
func (b *cudaDevice) gemvMidReady() bool {
	err := b.k.MidSupported()
	gemvMidOnce.Do(func() {
		if err != nil {
			slog.Warn("TILERT_GPU_GEMV_MID=1: the mid module does not load; the default grouped GEMVs run", "err", err)
			return
		}
		slog.Info("TILERT_GPU_GEMV_MID=1: one-row attention-input projections on gemv_mid_group", "shape", gemvMidShape)
	})
	return err == nil
}

// midShape is the variant TILERT_GPU_GEMV_MID_SHAPE names, or the default
// (said in the log when the name is unknown).
func midShape(v string) string {
	if v == "" {
		return kernels.GroupMidDefault
	}
	if _, ok := kernels.GroupMidShapes[v]; !ok {
		slog.Warn("TILERT_GPU_GEMV_MID_SHAPE: unknown shape; the default runs", "shape", v, "default", kernels.GroupMidDefault)
		return kernels.GroupMidDefault
	}
	return v
}

// midRows says whether a launch of M input rows takes the mid path.
func midRows(M int) bool { return gemvMidOn && M == 1 }
