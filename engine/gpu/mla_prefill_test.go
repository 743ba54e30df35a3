package gpu

import (
	"strings"
	"testing"

	"github.com/tilert-go/tilert/engine"
	"github.com/tilert-go/tilert/engine/internal/enginetest"
)

// withMLAPrefill turns TILERT_GPU_MLA_PREFILL on for one test: the fp8
// MLA of prefill groups of >= mlaPrefillMinRows rows runs on mlaPrefill.
func withMLAPrefill(t *testing.T) {
	old := mlaPrefillOn
	mlaPrefillOn = true
	t.Cleanup(func() { mlaPrefillOn = old })
}

// The engine checks with the prefill MLA kernel on: greedy == CPU serving
// (batched, with and without MTP) through prefills of chunks of 32 rows.
func TestEmuMLAPrefillGreedy(t *testing.T) {
	withMLAPrefill(t)
	testGreedyMatchesCPU(t, onEmu, engine.CacheFP8DSMLA)
}

func TestGPUMLAPrefillGreedy(t *testing.T) {
	withMLAPrefill(t)
	testGreedyMatchesCPU(t, onGPU, engine.CacheFP8DSMLA)
}

// The same on each prefill kernel (TILERT_GPU_MLA_PREFILL=1, 2, 3), and
// the prefill caches against the CPU's with it.
func TestGPUMLAPrefillKernels(t *testing.T) {
	withMLAPrefill(t)
	old := mlaPrefillMode
	t.Cleanup(func() { mlaPrefillMode = old })
	for _, m := range []int{1, 2, 3} {
		mlaPrefillMode = m
		t.Logf("TILERT_GPU_MLA_PREFILL=%d", m)
		testGreedyMatchesCPU(t, onGPU, engine.CacheFP8DSMLA)
		testCachesMatchCPU(t, onGPU)
	}
}

// A prefill takes mlaPrefill only with the switch on (the default path
// stays mlaDecode), and gives the same first token either way.
func TestEmuMLAPrefillRouted(t *testing.T) { testMLAPrefillRouted(t, onEmu) }
func TestGPUMLAPrefillRouted(t *testing.T) { testMLAPrefillRouted(t, onGPU) }

func testMLAPrefillRouted(t *testing.T, kind deviceKind) {
	if kind == onGPU {
		gpuDevice(t)
	}
	old := mlaPrefillOn
	t.Cleanup(func() { mlaPrefillOn = old })
	pr := enginetest.Presets[0]
	w, src := hfSourceOf(t, enginetest.PresetDir(t, pr))
	prompt := genCases(w.Config().VocabSize)[1].prompt
	if len(prompt) < mlaPrefillMinRows {
		t.Fatalf("prompt of %d tokens: no group of %d rows", len(prompt), mlaPrefillMinRows)
	}
	var first [2]int
	for k, on := range []bool{false, true} {
		mlaPrefillOn = on
		ge := newTestEngine(t, kind, src, engine.Options{MaxSeqLen: maxSeq, Slots: 1})
		tok, prof, err := ge.ProfilePrefill(0, prompt, engine.Params{})
		if err != nil {
			t.Fatalf("%+v", err)
		}
		first[k] = tok
		names := map[string]int{}
		for _, op := range prof.Ops {
			n, _, _ := strings.Cut(op.Name, " ")
			names[n] += op.Count
		}
		if on && names["mlaPrefill"] == 0 {
			t.Errorf("switch on: no mlaPrefill call in the prefill: %v", names)
		}
		if !on && names["mlaPrefill"] != 0 {
			t.Errorf("switch off: %d mlaPrefill calls in the prefill", names["mlaPrefill"])
		}
		t.Logf("%s switch=%v: mlaPrefill %d, mlaDecode %d calls", kind, on, names["mlaPrefill"], names["mlaDecode"])
	}
	if first[0] != first[1] {
		t.Errorf("first token %d with mlaPrefill, %d without", first[1], first[0])
	}
}
