package gpu

import (
	"testing"

	"github.com/tilert-go/tilert/cuda"
	"github.com/tilert-go/tilert/cuda/kernels"
	"github.com/tilert-go/tilert/engine"
)

// TestGPUIdxOne: with TILERT_GPU_IDX_ONE's fused scores + top-k taking
// every row past index_topk (idxOneMinT lowered to 0 in-process: the tiny
// presets' rows are short) the engine's greedy output equals the CPU
// engine's (serving mode, with and without MTP, one slot and batched), with
// the cooperative launch (=1) and the plain one (=plain), and so does the TP
// shard's (cooperative: its ranks share this GPU); fails unless the fused
// kernel ran.
func TestGPUIdxOne(t *testing.T) {
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
	defer func(on, coop bool, minT int) { idxOneOn, idxOneCoop, idxOneMinT = on, coop, minT }(idxOneOn, idxOneCoop, idxOneMinT)
	idxOneOn, idxOneMinT = true, 0
	for _, coop := range []bool{true, false} {
		idxOneCoop = coop
		tag := map[bool]string{true: " idx-one", false: " idx-one plain"}[coop]
		n0 := idxOneLaunches.Load()
		testGreedyCases(t, onGPU, engine.CacheFP8DSMLA, genCases, tag)
		n1 := idxOneLaunches.Load()
		t.Logf("%s: fused launches: engine %d", tag, n1-n0)
		if n1 == n0 {
			t.Errorf("%s: the fused kernel never ran", tag)
		}
	}
	idxOneCoop = true
	n1 := idxOneLaunches.Load()
	testShardGreedy(t, onGPU, CommOneShot, engine.ModeServing)
	if n2 := idxOneLaunches.Load(); n2 == n1 {
		t.Errorf("idx-one: the fused kernel never ran in the shard")
	}
}

// TestEmuIdxOneWiring (CI): forward's TILERT_GPU_IDX_ONE path (one op for
// the scores and the top-k) on the emulator, every row past index_topk
// taking it: greedy output equals the CPU engine's.
func TestEmuIdxOneWiring(t *testing.T) {
	defer func(on bool, minT int) { idxOneOn, idxOneMinT = on, minT }(idxOneOn, idxOneMinT)
	idxOneOn, idxOneMinT = true, 0
	n0 := idxOneLaunches.Load()
	testGreedyCases(t, onEmu, engine.CacheFP8DSMLA, genCases, " idx-one")
	if idxOneLaunches.Load() == n0 {
		t.Fatal("TILERT_GPU_IDX_ONE: forward never took the fused op")
	}
}
