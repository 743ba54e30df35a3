package gpu

import (
	"testing"

	"github.com/tilert-go/tilert/engine"
)

// TestGPUIdxF8: with the serving indexer's scores on IndexerScoresF8 the
// greedy tokens still equal the CPU engine's (trained tiny models, fp8 DSA
// cache), and the f8 kernel is what ran.
func TestGPUIdxF8(t *testing.T) {
	defer func(v bool) { idxF8On = v }(idxF8On)
	idxF8On = true
	n0 := idxF8Launches.Load()
	testGreedyMatchesCPU(t, onGPU, engine.CacheFP8DSMLA)
	n := idxF8Launches.Load() - n0
	t.Logf("indexer_scores_f8 launches: %d", n)
	if n == 0 && !t.Skipped() {
		t.Errorf("indexer_scores_f8 never ran with idxF8On")
	}
}
