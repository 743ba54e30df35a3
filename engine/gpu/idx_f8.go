package gpu

import (
	"os"
	"sync/atomic"
)

// idxF8Mode: TILERT_GPU_IDX_F8 moves the serving indexer's scores (one
// slot's rows and the launch across slots) off IndexerScoresMMA's f16
// mma.sync, with the same histogram for the top-k after them. Opt-in until
// measured (cuda/kernels/NOTES.md, "The indexer scores on the fp8
// mma.sync"):
//   - "1": kernels.Set.IndexerScoresF8 (mma.sync m16n8k32 e4m3; on sm_90
//     ptxas lowers it to f16 conversions and HMMA, predicted slower);
//   - "wg": kernels.Set.IndexerScoresWG (wgmma m64n64k32 e4m3, the sm_90a
//     module: Hopper's fp8 tensor-core path, whose accumulation is wgmma's).
//
// Their head sums are in another order (and, for wg, precision) than the
// f16 kernel's; TestKernelIndexerF8 measures the scores and selections.
var idxF8Mode = os.Getenv("TILERT_GPU_IDX_F8")

// idxF8Launches counts the engine's IndexerScoresF8 / WG launches (tests).
var idxF8Launches atomic.Int64
