package gpu

import (
	"testing"

	"github.com/tilert-go/tilert/cuda"
	"github.com/tilert-go/tilert/cuda/kernels"
)

// TILERT_GPU_MLA_PREFILL=5 (mla_prefill_wg, wgmma) through the engine: the
// checks of =4 (mla_prefill_h1: the same function and roundings, the same
// emulated transcription, so the same references and bounds), on a 9.0
// device where the sm_90a module must load, and counted: the kernel must
// actually have run (no silent fallback to =4).

// withMLAPrefillWG is TILERT_GPU_MLA_PREFILL=5 for one test; on the GPU it
// skips off compute capability 9.0 and fails when the sm_90a module does
// not load there.
func withMLAPrefillWG(t *testing.T, kind deviceKind) {
	withMLAPrefillH1(t)
	mlaPrefillMode = 5
	if kind != onGPU {
		return
	}
	var cc [2]int
	var wgErr error
	if err := gpuDevice(t).Do(func(c *cuda.Ctx) error {
		k, err := kernels.Load(c)
		if err != nil {
			return err
		}
		cc = [2]int{c.Info().CCMajor, c.Info().CCMinor}
		wgErr = k.WGSupported()
		return nil
	}); err != nil {
		t.Fatalf("%+v", err)
	}
	if cc != [2]int{9, 0} {
		t.Skipf("mla_prefill_wg needs compute capability 9.0 (this device is %d.%d)", cc[0], cc[1])
	}
	if wgErr != nil {
		t.Fatalf("the sm_90a module does not load on this 9.0 device: %+v", wgErr)
	}
}

// wgRan fails the test unless mla_prefill_wg ran since n0 launches.
func wgRan(t *testing.T, n0 int64) {
	t.Helper()
	n := wgLaunches.Load() - n0
	if n == 0 {
		t.Fatal("TILERT_GPU_MLA_PREFILL=5: no mlaPrefill call ran mla_prefill_wg")
	}
	t.Logf("mla_prefill_wg ran %d times", n)
}

// TestGPUMLAPrefillH1's checks with =5: greedy and caches against the
// emulated one-part forward, caches against the CPU, routing, exact mode.
func TestGPUMLAPrefillWG(t *testing.T) {
	pinGemmParts3(t)
	gpuDevice(t)
	withMLAPrefillWG(t, onGPU)
	n0 := wgLaunches.Load()
	testGreedyMatchesRef(t, onGPU, onEmu)
	testCachesMatchRef(t, onGPU, onEmu, h1CacheBoundCPU)
	testMLAPrefillH1VsCPU(t, onGPU)
	testMLAPrefillRouted(t, onGPU)
	testMLAPrefillH1NotExact(t, onGPU)
	wgRan(t, n0)
}

const onePartAllWGTag = " (all one-part: GEMMs, absorbs, MLA prefill wg)"

// TestGPUPrefillOnePartAll with =5: every one-part switch together.
func TestGPUPrefillOnePartAllWG(t *testing.T) {
	gpuDevice(t)
	withOnePartAll(t)
	withMLAPrefillWG(t, onGPU)
	n0 := wgLaunches.Load()
	testCachesOnePart(t, onGPU, onePartAllWGTag)
	testLogitsOnePart(t, onGPU, onePartAllWGTag)
	wgRan(t, n0)
}

// The emulator runs =5 as =4 (mlaPrefillH1): the same first tokens.
func TestEmuMLAPrefillWGIsH1(t *testing.T) {
	withMLAPrefillWG(t, onEmu)
	if mlaPrefillMode != 5 {
		t.Fatalf("mode %d", mlaPrefillMode)
	}
	testMLAPrefillH1NotExact(t, onEmu)
	if mlaPrefillMode != 5 {
		t.Fatalf("withMLAPrefillH1 inside the test moved =5 to %d", mlaPrefillMode)
	}
}
