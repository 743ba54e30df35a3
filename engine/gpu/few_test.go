package gpu

import (
	"testing"

	"github.com/tilert-go/tilert/cuda"
	"github.com/tilert-go/tilert/cuda/kernels"
	"github.com/tilert-go/tilert/engine"
)

// TestGPUFewKernels: with TILERT_GPU_MLA_FEW=1 and TILERT_GPU_TOPK_FAST=1,
// then =2 (set in-process) the engine's greedy output equals the CPU engine's
// (serving mode, with and without MTP, one slot and batched: the tiny
// presets' heads are few and their index_topk 32 < the long prompt, so
// both kernels run), and so does the TP shard's (one-shot communicator on
// this device); fails unless mla_decode_few and topk_fast (=2:
// indexer_scores_topk) ran.
func TestGPUFewKernels(t *testing.T) {
	var cc int
	var fewErr error
	if err := gpuDevice(t).Do(func(c *cuda.Ctx) error {
		k, err := kernels.Load(c)
		if err != nil {
			return err
		}
		cc = c.Info().CCMajor
		fewErr = k.FewSupported()
		return nil
	}); err != nil {
		t.Fatalf("%+v", err)
	}
	if cc < 9 {
		t.Skipf("the few-heads kernels need sm_90 (this device is %d.x)", cc)
	}
	if fewErr != nil {
		t.Fatalf("the few-heads module does not load on this sm_90 device: %+v", fewErr)
	}
	defer func(m, k, f bool) { mlaFewOn, topkFastOn, topkFusedOn = m, k, f }(mlaFewOn, topkFastOn, topkFusedOn)
	// =1: topk_fast after the scores; =2: the fused scores + selection
	// (topk_fast where rows are too long for it).
	for _, fused := range []bool{false, true} {
		mlaFewOn, topkFastOn, topkFusedOn = true, true, fused
		tag := " few"
		if fused {
			tag = " few fused"
		}
		m0, k0, f0 := fewMLALaunches.Load(), fastTopKLaunches.Load(), fusedTopKLaunches.Load()
		testGreedyCases(t, onGPU, engine.CacheFP8DSMLA, genCases, tag)
		m1, k1, f1 := fewMLALaunches.Load(), fastTopKLaunches.Load(), fusedTopKLaunches.Load()
		testShardGreedy(t, onGPU, CommOneShot, engine.ModeServing)
		m2, k2, f2 := fewMLALaunches.Load(), fastTopKLaunches.Load(), fusedTopKLaunches.Load()
		t.Logf("%s: engine: mla_decode_few %d launches, topk_fast %d, indexer_scores_topk %d; shard: %d, %d, %d",
			tag, m1-m0, k1-k0, f1-f0, m2-m1, k2-k1, f2-f1)
		sel1, sel2 := k1-k0, k2-k1
		what := "topk_fast"
		if fused {
			sel1, sel2, what = f1-f0, f2-f1, "indexer_scores_topk"
		}
		if m1 == m0 || sel1 == 0 {
			t.Errorf("%s engine: mla_decode_few ran %d times, %s %d times (both must run)", tag, m1-m0, what, sel1)
		}
		if m2 == m1 || sel2 == 0 {
			t.Errorf("%s shard: mla_decode_few ran %d times, %s %d times (both must run)", tag, m2-m1, what, sel2)
		}
	}
}

// TestEmuTopKFusedWiring (CI): forward's TILERT_GPU_TOPK_FAST=2 path (one
// indexerScoresTopK call for the scores and the selection, merged slots and
// per slot) on the emulator gives the CPU engine's greedy tokens, so its
// arguments (scores, selection, rows, cache offsets, row bases) are wired
// as the two calls it replaces.
func TestEmuTopKFusedWiring(t *testing.T) {
	defer func(f, k bool) { topkFusedOn, topkFastOn = f, k }(topkFusedOn, topkFastOn)
	topkFusedOn, topkFastOn = true, true
	n0 := emuFusedCalls.Load()
	testGreedyCases(t, onEmu, engine.CacheFP8DSMLA, genCases, " topk fused")
	if n := emuFusedCalls.Load() - n0; n == 0 {
		t.Fatal("forward never took the fused scores + top-k path")
	} else {
		t.Logf("indexerScoresTopK ran %d times", n)
	}
}
