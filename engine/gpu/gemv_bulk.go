package gpu

import (
	"log/slog"
	"os"
	"sync"
	"sync/atomic"

	"github.com/tilert-go/tilert/cuda"
	"github.com/tilert-go/tilert/cuda/kernels"
)

// TILERT_GPU_GEMV_BULK=1 (opt-in): the fp8 GEMVs of one input row (dense,
// with residual, gate-up paired) and the MoE expert slots run on the
// bulk-copy GEMV (kernels.GemvFP8Bulk / GateUpFP8Bulk / ExpertsFP8Bulk,
// the sm_90a module: weights streamed by cp.async.bulk into a shared-memory
// ring) in place of the tile kernels. Its floats are the tile kernel's bit
// for bit (same group size, same summation order), so the emulator's tile
// transcription stands. Where the sm_90a module does not load (not a
// compute capability 9.0 device, NVRTC < 12) or a shape does not fit, the
// tile kernels run, said once in the log. Ignored with
// TILERT_GPU_GEMV_TILE=0.
var (
	gemvBulkOn = os.Getenv("TILERT_GPU_GEMV_BULK") == "1" && gemvTileOn
	// gemvBulkOnce: the switch's outcome is logged once a process.
	gemvBulkOnce sync.Once
	// gemvBulkLaunches counts launches that ran the bulk GEMV (tests).
	gemvBulkLaunches atomic.Int64
)

// gemvBulkReady says whether the bulk GEMV runs here (the sm_90a module
// loads); with the switch on, the runners call it before any capture.
func (b *cudaDevice) gemvBulkReady() bool {
	err := b.k.WGSupported()
	gemvBulkOnce.Do(func() {
		if err != nil {
			slog.Warn("TILERT_GPU_GEMV_BULK=1: the bulk-copy GEMV is unavailable (needs sm_90a: an H100/H200 and NVRTC 12+); the tile GEMVs run", "err", err)
			return
		}
		slog.Info("TILERT_GPU_GEMV_BULK=1: the bulk-copy GEMV (sm_90a module) runs the one-row fp8 GEMVs and the MoE experts")
	})
	return err == nil
}

// bulkRow says whether a one-row fp8 GEMV on x (row stride ldx) over the
// weights w takes the bulk GEMV.
func (b *cudaDevice) bulkRow(x cuda.DevPtr, K, M, ldx int, w ...cuda.DevPtr) bool {
	if !gemvBulkOn || M != 1 || !kernels.BulkOK(x, K, ldx, w...) || !b.gemvBulkReady() {
		return false
	}
	gemvBulkLaunches.Add(1)
	return true
}
