package gpu

import (
	"fmt"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/tilert-go/tilert/cuda"
	"github.com/tilert-go/tilert/cuda/kernels"
	"github.com/tilert-go/tilert/engine"
)

// TILERT_GPU_MLA_PREFILL=5 (mla_prefill_wg, wgmma) through the engine: the
// checks of =4 (mla_prefill_h1: the same function and roundings, the same
// emulated transcription, so the same references and bounds), on a 9.0
// device where the sm_90a module must load, and counted: the kernel must
// actually have run (no silent fallback to =4).

// withMLAPrefillWGMode is TILERT_GPU_MLA_PREFILL=mode (5: mla_prefill_wg,
// 6: mla_prefill_wg2) for one test; on the GPU it skips off compute
// capability 9.0 and fails when the sm_90a module does not load there.
func withMLAPrefillWGMode(t *testing.T, kind deviceKind, mode int) {
	withMLAPrefillH1(t)
	mlaPrefillMode = mode
	if kind != onGPU {
		return
	}
	needSM90a(t)
}

// needSM90a skips off compute capability 9.0 and fails when the sm_90a
// module does not load there.
func needSM90a(t *testing.T) {
	t.Helper()
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
		t.Skipf("the sm_90a module (wgmma) needs compute capability 9.0 (this device is %d.%d)", cc[0], cc[1])
	}
	if wgErr != nil {
		t.Fatalf("the sm_90a module does not load on this 9.0 device: %+v", wgErr)
	}
}

// wgKernels: the engine's wgmma MLA prefill modes, their kernels' names
// and launch counters.
var wgKernels = map[int]struct {
	name string
	n    *atomic.Int64
}{5: {"mla_prefill_wg", &wgLaunches}, 6: {"mla_prefill_wg2", &wg2Launches}}

// wgLaunchCounts reads every wgmma mode's launch counter.
func wgLaunchCounts() map[int]int64 {
	n := map[int]int64{}
	for m, k := range wgKernels {
		n[m] = k.n.Load()
	}
	return n
}

// wgModeRan fails the test unless mode's kernel ran since n0 and no other
// wgmma kernel did (no silent fallback).
func wgModeRan(t *testing.T, mode int, n0 map[int]int64) {
	t.Helper()
	for m, k := range wgKernels {
		n := k.n.Load() - n0[m]
		switch {
		case m == mode && n == 0:
			t.Fatalf("TILERT_GPU_MLA_PREFILL=%d: no mlaPrefill call ran %s", mode, k.name)
		case m == mode:
			t.Logf("%s ran %d times", k.name, n)
		case n != 0:
			t.Fatalf("TILERT_GPU_MLA_PREFILL=%d ran %s %d times", mode, k.name, n)
		}
	}
}

// testGPUMLAPrefillWGMode is TestGPUMLAPrefillH1's checks with a wgmma
// mode: greedy and caches against the emulated one-part forward, caches
// against the CPU, routing, exact mode.
func testGPUMLAPrefillWGMode(t *testing.T, mode int) {
	pinGemmParts3(t)
	gpuDevice(t)
	withMLAPrefillWGMode(t, onGPU, mode)
	n0 := wgLaunchCounts()
	testGreedyMatchesRef(t, onGPU, onEmu)
	testCachesMatchRef(t, onGPU, onEmu, h1CacheBoundCPU)
	testMLAPrefillH1VsCPU(t, onGPU)
	testMLAPrefillRouted(t, onGPU)
	testMLAPrefillH1NotExact(t, onGPU)
	wgModeRan(t, mode, n0)
}

// testGPUPrefillOnePartAllWGMode is TestGPUPrefillOnePartAll with a wgmma
// mode: every one-part switch together.
func testGPUPrefillOnePartAllWGMode(t *testing.T, mode int) {
	gpuDevice(t)
	withOnePartAll(t)
	withMLAPrefillWGMode(t, onGPU, mode)
	n0 := wgLaunchCounts()
	tag := fmt.Sprintf(" (all one-part: GEMMs, absorbs, MLA prefill %s)", strings.TrimPrefix(wgKernels[mode].name, "mla_prefill_"))
	testCachesOnePart(t, onGPU, tag)
	testLogitsOnePart(t, onGPU, tag)
	wgModeRan(t, mode, n0)
}

// testEmuMLAPrefillWGModeIsH1: the emulator runs a wgmma mode as =4
// (mlaPrefillH1): the same first tokens; and withMLAPrefillH1 inside a
// test keeps the mode.
func testEmuMLAPrefillWGModeIsH1(t *testing.T, mode int) {
	withMLAPrefillWGMode(t, onEmu, mode)
	if mlaPrefillMode != mode {
		t.Fatalf("mode %d", mlaPrefillMode)
	}
	testMLAPrefillH1NotExact(t, onEmu)
	if mlaPrefillMode != mode {
		t.Fatalf("withMLAPrefillH1 inside the test moved =%d to %d", mode, mlaPrefillMode)
	}
}

// =5: mla_prefill_wg. =6: mla_prefill_wg2 (=5's arithmetic with a producer
// warpgroup).
func TestGPUMLAPrefillWG(t *testing.T)         { testGPUMLAPrefillWGMode(t, 5) }
func TestGPUMLAPrefillWG2(t *testing.T)        { testGPUMLAPrefillWGMode(t, 6) }
func TestGPUPrefillOnePartAllWG(t *testing.T)  { testGPUPrefillOnePartAllWGMode(t, 5) }
func TestGPUPrefillOnePartAllWG2(t *testing.T) { testGPUPrefillOnePartAllWGMode(t, 6) }
func TestEmuMLAPrefillWGIsH1(t *testing.T)     { testEmuMLAPrefillWGModeIsH1(t, 5) }
func TestEmuMLAPrefillWG2IsH1(t *testing.T)    { testEmuMLAPrefillWGModeIsH1(t, 6) }

// TestGPUMLADecodeWG: TILERT_GPU_MLA_WG=1 (the decode step's sparse MLA
// on mla_decode_wg2 for every head count; one fp16 part) keeps greedy ==
// CPU and the goldens; the few-heads kernel is off so that the tiny
// models' heads take it, and the test fails unless it ran.
func TestGPUMLADecodeWG(t *testing.T) {
	needSM90a(t)
	defer func(w string, f bool) { mlaWG, mlaFewOn = w, f }(mlaWG, mlaFewOn)
	mlaWG, mlaFewOn = "1", false
	n0 := mlaWGLaunches.Load()
	testGreedyCases(t, onGPU, engine.CacheFP8DSMLA, genCases, " mla wg")
	testGolden(t, onGPU)
	n := mlaWGLaunches.Load() - n0
	if n == 0 {
		t.Fatal("TILERT_GPU_MLA_WG=1: no decode launch ran mla_decode_wg2")
	}
	t.Logf("TILERT_GPU_MLA_WG=1: mla_decode_wg2 ran %d launches", n)
}

// TestGPUMLADecodeWGHeads: TILERT_GPU_MLA_HEADS=32
// (kernels.MLAHeadsPerBlock: one-tile decode MLA blocks of 32 heads,
// mla_decode_wg2h) with TILERT_GPU_MLA_WG=1 keeps greedy == CPU and
// the goldens; the tiny models' few heads sit in a block beside zero rows.
// Fails unless the kernels ran.
func TestGPUMLADecodeWGHeads(t *testing.T) {
	needSM90a(t)
	defer func(w string, f bool, h int) { mlaWG, mlaFewOn, kernels.MLAHeadsPerBlock = w, f, h }(mlaWG, mlaFewOn, kernels.MLAHeadsPerBlock)
	for _, hpb := range []int{32} {
		mlaWG, mlaFewOn, kernels.MLAHeadsPerBlock = "1", false, hpb
		n0 := kernels.MLAWG2HLaunches.Load()
		testGreedyCases(t, onGPU, engine.CacheFP8DSMLA, genCases, fmt.Sprintf(" mla wg %d heads", hpb))
		testGolden(t, onGPU)
		n := kernels.MLAWG2HLaunches.Load() - n0
		if n == 0 {
			t.Fatalf("TILERT_GPU_MLA_HEADS=%d: no decode launch ran mla_decode_wg2h", hpb)
		}
		t.Logf("TILERT_GPU_MLA_HEADS=%d: %d launches", hpb, n)
	}
}

// TestMLAWGRule: mla_decode_wg2 by default where it measured faster (64
// heads or more at any rows), never for a TP-8 shard's 16 / 8 heads; =1
// everywhere, =0 nowhere.
func TestMLAWGRule(t *testing.T) {
	for _, c := range []struct {
		mode  string
		nq, H int
		want  bool
	}{{"", 1, 128, true}, {"", 4, 128, true}, {"", 1, 64, true}, {"", 1, 32, false}, {"", 2, 64, true}, {"", 4, 16, false}, {"", 1, 8, false},
		{"1", 1, 8, true}, {"1", 1, 0, false}, {"0", 4, 128, false}} {
		if got := mlaWGRule(c.mode, c.nq, c.H); got != c.want {
			t.Errorf("TILERT_GPU_MLA_WG=%q nq=%d H=%d: %v, want %v", c.mode, c.nq, c.H, got, c.want)
		}
	}
}
