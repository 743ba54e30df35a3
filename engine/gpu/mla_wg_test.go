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
func withMLAPrefillWG(t *testing.T, kind deviceKind) { withMLAPrefillWGMode(t, kind, 5) }

// withMLAPrefillWGMode is TILERT_GPU_MLA_PREFILL=mode (5: mla_prefill_wg,
// 6: mla_prefill_wg2) for one test, with withMLAPrefillWG's GPU rules.
func withMLAPrefillWGMode(t *testing.T, kind deviceKind, mode int) {
	withMLAPrefillH1(t)
	mlaPrefillMode = mode
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

// TILERT_GPU_MLA_PREFILL=6 (mla_prefill_wg2: =5's arithmetic with a
// producer warpgroup) through the engine: =5's checks, counted on
// wg2Launches (no silent fallback to =4 or =5).

// withMLAPrefillWG2 is TILERT_GPU_MLA_PREFILL=6 for one test (the GPU
// rules of withMLAPrefillWG).
func withMLAPrefillWG2(t *testing.T, kind deviceKind) { withMLAPrefillWGMode(t, kind, 6) }

// wg2Ran fails the test unless mla_prefill_wg2 ran since n0 launches.
func wg2Ran(t *testing.T, n0 int64) {
	t.Helper()
	n := wg2Launches.Load() - n0
	if n == 0 {
		t.Fatal("TILERT_GPU_MLA_PREFILL=6: no mlaPrefill call ran mla_prefill_wg2")
	}
	t.Logf("mla_prefill_wg2 ran %d times", n)
}

// TestGPUMLAPrefillWG's checks with =6.
func TestGPUMLAPrefillWG2(t *testing.T) {
	pinGemmParts3(t)
	gpuDevice(t)
	withMLAPrefillWG2(t, onGPU)
	n0, w0 := wg2Launches.Load(), wgLaunches.Load()
	testGreedyMatchesRef(t, onGPU, onEmu)
	testCachesMatchRef(t, onGPU, onEmu, h1CacheBoundCPU)
	testMLAPrefillH1VsCPU(t, onGPU)
	testMLAPrefillRouted(t, onGPU)
	testMLAPrefillH1NotExact(t, onGPU)
	wg2Ran(t, n0)
	if n := wgLaunches.Load() - w0; n != 0 {
		t.Fatalf("TILERT_GPU_MLA_PREFILL=6 ran mla_prefill_wg %d times", n)
	}
}

const onePartAllWG2Tag = " (all one-part: GEMMs, absorbs, MLA prefill wg2)"

// TestGPUPrefillOnePartAll with =6: every one-part switch together.
func TestGPUPrefillOnePartAllWG2(t *testing.T) {
	gpuDevice(t)
	withOnePartAll(t)
	withMLAPrefillWG2(t, onGPU)
	n0 := wg2Launches.Load()
	testCachesOnePart(t, onGPU, onePartAllWG2Tag)
	testLogitsOnePart(t, onGPU, onePartAllWG2Tag)
	wg2Ran(t, n0)
}

// The emulator runs =6 as =4 (mlaPrefillH1): the same first tokens; and
// withMLAPrefillH1 inside a test keeps =6.
func TestEmuMLAPrefillWG2IsH1(t *testing.T) {
	withMLAPrefillWG2(t, onEmu)
	if mlaPrefillMode != 6 {
		t.Fatalf("mode %d", mlaPrefillMode)
	}
	testMLAPrefillH1NotExact(t, onEmu)
	if mlaPrefillMode != 6 {
		t.Fatalf("withMLAPrefillH1 inside the test moved =6 to %d", mlaPrefillMode)
	}
}
