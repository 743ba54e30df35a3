package gpu

import (
	"testing"

	"github.com/tilert-go/tilert/engine"
)

// withGemm turns the tensor-core prefill on for one test (gemm.go; off by
// default) with prefill chunks of 48 rows, so the tiny presets' 80-token
// prompt runs as two GEMM chunks (48 + 32 rows) with the grouped MoE.
func withGemm(t *testing.T) {
	old := gemmOn
	gemmOn = true
	t.Cleanup(func() { gemmOn = old })
	t.Setenv("TILERT_GPU_PREFILL_CHUNK", "48")
}

// The engine checks with the tensor-core prefill on: greedy == CPU serving
// (batched, with and without MTP), prefill caches vs the CPU's bytes, exact
// mode vs the HF goldens (its float32 bound holds: x is split into 3 bf16
// parts, so products are float32's).
func TestEmuPrefillGemmGreedy(t *testing.T) {
	withGemm(t)
	testGreedyMatchesCPU(t, onEmu, engine.CacheFP8DSMLA)
}

func TestGPUPrefillGemmGreedy(t *testing.T) {
	withGemm(t)
	testGreedyMatchesCPU(t, onGPU, engine.CacheFP8DSMLA)
}

func TestEmuPrefillGemmCaches(t *testing.T) {
	withGemm(t)
	testCachesMatchCPU(t, onEmu)
}

func TestGPUPrefillGemmCaches(t *testing.T) {
	withGemm(t)
	testCachesMatchCPU(t, onGPU)
}

func TestGPUPrefillGemmGoldenExact(t *testing.T) {
	withGemm(t)
	testGoldenExact(t, onGPU)
}

// TestPrefillChunk pins the chunk choice: 32 rows on the GEMV path, 256
// with the GEMMs, the environment's value when set.
func TestPrefillChunk(t *testing.T) {
	old := gemmOn
	t.Cleanup(func() { gemmOn = old })
	for _, c := range []struct {
		on   bool
		env  string
		want int
	}{{false, "", oldChunkLen}, {true, "", defaultChunkLen}, {true, "100", 100}, {false, "64", 64}, {true, "junk", defaultChunkLen}} {
		gemmOn = c.on
		t.Setenv("TILERT_GPU_PREFILL_CHUNK", c.env)
		if got := prefillChunk(); got != c.want {
			t.Errorf("gemm %v, TILERT_GPU_PREFILL_CHUNK=%q: chunk %d, want %d", c.on, c.env, got, c.want)
		}
	}
}
