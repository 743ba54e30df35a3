package gpu

import (
	"os"
	"sync/atomic"
)

// idxF8On: TILERT_GPU_IDX_F8=1 scores the serving indexer (one slot's rows
// and the launch across slots) with kernels.Set.IndexerScoresF8 (mma.sync
// m16n8k32 e4m3) instead of IndexerScoresMMA's f16 instruction. Opt-in
// until measured: on sm_90 ptxas lowers the e4m3 mma.sync to f16
// conversions and HMMA (cuda/kernels/NOTES.md, "The indexer scores on the
// fp8 mma.sync"), and its sums are in another order than the f16 kernel's.
var idxF8On = os.Getenv("TILERT_GPU_IDX_F8") == "1"

// idxF8Launches counts the engine's IndexerScoresF8 launches (tests).
var idxF8Launches atomic.Int64
