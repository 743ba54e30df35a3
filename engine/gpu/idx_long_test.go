package gpu

import (
	"testing"

	"github.com/tilert-go/tilert/cuda"
	"github.com/tilert-go/tilert/cuda/kernels"
	"github.com/tilert-go/tilert/engine"
)

// TestGPUIdxLong: with TILERT_GPU_IDX_LONG's kernels taking every row
// (idxLongMinT lowered to 0 in-process: the tiny presets' rows are short)
// the engine's greedy output equals the CPU engine's (serving mode, with
// and without MTP, one slot and batched), and so does the TP shard's; fails
// unless the long-row kernels ran (the deep scores, and topk_cl on sm_90).
func TestGPUIdxLong(t *testing.T) {
	var mma bool
	if err := gpuDevice(t).Do(func(c *cuda.Ctx) error {
		k, err := kernels.Load(c)
		if err != nil {
			return err
		}
		mma = k.IndexerMMASupported()
		return nil
	}); err != nil {
		t.Fatalf("%+v", err)
	}
	if !mma {
		t.Skip("the tensor-core indexer needs sm_89")
	}
	defer func(on bool, minT int) { idxLongOn, idxLongMinT = on, minT }(idxLongOn, idxLongMinT)
	idxLongOn, idxLongMinT = true, 0
	const tag = " idx-long"
	n0 := idxLongLaunches.Load()
	testGreedyCases(t, onGPU, engine.CacheFP8DSMLA, genCases, tag)
	n1 := idxLongLaunches.Load()
	testShardGreedy(t, onGPU, CommOneShot, engine.ModeServing)
	n2 := idxLongLaunches.Load()
	t.Logf("%s: long-row kernel launches: engine %d, shard %d", tag, n1-n0, n2-n1)
	if n1 == n0 || n2 == n1 {
		t.Errorf("%s: the long-row kernels ran %d (engine) and %d (shard) times (both must run)", tag, n1-n0, n2-n1)
	}
}
