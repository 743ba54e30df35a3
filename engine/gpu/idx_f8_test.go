package gpu

import (
	"testing"

	"github.com/tilert-go/tilert/engine"
)

// TestGPUIdxF8: with the serving indexer's scores on IndexerScoresF8
// (TILERT_GPU_IDX_F8=1) and on IndexerScoresWG (=wg) the greedy tokens still
// equal the CPU engine's (trained tiny models, fp8 DSA cache), and the
// kernel is what ran.
func TestGPUIdxF8(t *testing.T) {
	defer func(v string) { idxF8Mode = v }(idxF8Mode)
	for _, mode := range []string{"1", "wg"} {
		t.Run("mode="+mode, func(t *testing.T) {
			idxF8Mode = mode
			n0 := idxF8Launches.Load()
			testGreedyMatchesCPU(t, onGPU, engine.CacheFP8DSMLA)
			n := idxF8Launches.Load() - n0
			t.Logf("TILERT_GPU_IDX_F8=%s: %d launches", mode, n)
			if n == 0 && !t.Skipped() && !t.Failed() {
				t.Errorf("TILERT_GPU_IDX_F8=%s: the kernel never ran", mode)
			}
		})
	}
}
