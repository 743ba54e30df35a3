package gpu

import (
	"testing"

	"github.com/tilert-go/tilert/cuda"
	"github.com/tilert-go/tilert/cuda/kernels"
	"github.com/tilert-go/tilert/engine"
)

// TestGPUFewKernels: with TILERT_GPU_MLA_FEW=1 and TILERT_GPU_TOPK_FAST=1
// (set in-process) the engine's greedy output equals the CPU engine's
// (serving mode, with and without MTP, one slot and batched: the tiny
// presets' heads are few and their index_topk 32 < the long prompt, so
// both kernels run), and so does the TP shard's (one-shot communicator on
// this device); fails unless mla_decode_few and topk_fast ran.
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
	defer func(m, k bool) { mlaFewOn, topkFastOn = m, k }(mlaFewOn, topkFastOn)
	mlaFewOn, topkFastOn = true, true
	const tag = " few"
	m0, k0 := fewMLALaunches.Load(), fastTopKLaunches.Load()
	testGreedyCases(t, onGPU, engine.CacheFP8DSMLA, genCases, tag)
	m1, k1 := fewMLALaunches.Load(), fastTopKLaunches.Load()
	testShardGreedy(t, onGPU, CommOneShot, engine.ModeServing)
	m2, k2 := fewMLALaunches.Load(), fastTopKLaunches.Load()
	t.Logf("%s: engine: mla_decode_few %d launches, topk_fast %d; shard: %d, %d", tag, m1-m0, k1-k0, m2-m1, k2-k1)
	if m1 == m0 || k1 == k0 {
		t.Errorf("%s engine: mla_decode_few ran %d times, topk_fast %d times (both must run)", tag, m1-m0, k1-k0)
	}
	if m2 == m1 || k2 == k1 {
		t.Errorf("%s shard: mla_decode_few ran %d times, topk_fast %d times (both must run)", tag, m2-m1, k2-k1)
	}
}
