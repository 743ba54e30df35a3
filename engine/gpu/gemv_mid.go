package gpu

import (
	"log/slog"
	"os"
	"sync"

	"github.com/tilert-go/tilert/cuda/kernels"
)

// TILERT_GPU_GEMV_MID=0|1|2 (helper gmid, issue 10; =2 the default since
// session 9, =0 the tile GEMVs as before): the one-row
// q_b + wq_b projections of a decode step run on the gemv_mid_group
// kernels (cuda/kernels/cu/mid/gemv_mid.cu, a module of its own loaded on
// first use; every thread's share of its rows in one round trip); the layer
// input's grouped launch (K = 7168) keeps gemv_group, faster there on the
// H200 (gemvGroup, midMaxK):
//   - =1: q_b and the indexer's wq_b as one launch over the raw q_a with
//     q_a's RMSNorm in its prologue (projGroup's mode-2 form; the _n
//     kernels issue the weights' round before the prologue), so the layer's
//     4 attention-input launches become 2;
//   - =2: q_a's rmsnorm, then q_b and wq_b as one launch (mode 3's form): 3.
//
// Each segment keeps its group size G and the norm is rmsnorm's, so every
// output is the default launches' bit for bit and the emulator, the goldens
// and every tolerance stand unchanged. Applies to one input row (decode of
// one slot without MTP); several rows take the default path.
// TILERT_GPU_GEMV_MID_SHAPE picks the variant (kernels.GroupMidShapes:
// r8_d16, the default; r4_d16, r4_o4, r2_o4) for a device sweep. Ignored
// with TILERT_GPU_GEMV_TILE=0 or TILERT_GPU_GROUP=0.
var (
	gemvMidMode  = midMode(os.Getenv("TILERT_GPU_GEMV_MID"))
	gemvMidShape = midShape(os.Getenv("TILERT_GPU_GEMV_MID_SHAPE"))
	// gemvMidOnce: the switch's outcome is logged once a process.
	gemvMidOnce sync.Once
)

// midMode is the switch's mode ("1", "2"), "" when off: "2" unless the
// switch says 0 or 1 (the step with it: 2.935 against 2.961 ms at 8192, one
// slot, DeepSeek-V3.2 dims, H200, session 9; the whole gpu-check passed).
func midMode(v string) string {
	if !gemvTileOn || v == "0" {
		return ""
	}
	if v == "1" {
		return v
	}
	return "2"
}

// gemvMidReady says whether the mid module (kernels.MidSupported) loads
// here; with the switch on, the runners call it before any capture. Where
// it does not, the default grouped kernels run (the same bits), said once
// in the log.
func (b *cudaDevice) gemvMidReady() bool {
	err := b.k.MidSupported()
	gemvMidOnce.Do(func() {
		if err != nil {
			slog.Warn("TILERT_GPU_GEMV_MID: the mid module does not load; the default grouped GEMVs run", "err", err)
			return
		}
		slog.Info("TILERT_GPU_GEMV_MID: one-row attention-input projections on gemv_mid_group", "mode", gemvMidMode, "shape", gemvMidShape)
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

// midMaxK is the longest input row a grouped launch takes the mid kernels
// for (gemvGroup).
const midMaxK = 2048

// midRows says whether a grouped launch of M input rows takes the mid
// kernels (of rows up to midMaxK long).
func midRows(M int) bool { return gemvMidMode != "" && M == 1 }

// midNormed: projGroup runs q_b + wq_b with q_a's norm in the launch (=1).
func midNormed(M int) bool { return gemvMidMode == "1" && M == 1 }

// midQBGroup: projGroup runs q_b + wq_b as one launch after rmsnorm (=2).
func midQBGroup(M int) bool { return gemvMidMode == "2" && M == 1 }
