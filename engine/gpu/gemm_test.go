package gpu

import (
	"math"
	"math/rand/v2"
	"reflect"
	"slices"
	"testing"

	"github.com/tilert-go/tilert/cuda"
	"github.com/tilert-go/tilert/cuda/kernels"
	"github.com/tilert-go/tilert/engine/internal/enginetest"
	"github.com/tilert-go/tilert/model/synth"

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

// TestF16Round pins the fp16 rounding the emulator's transcription of
// gemm_split_p1 uses.
func TestF16Round(t *testing.T) {
	for _, c := range []struct{ in, want float32 }{
		{1, 1}, {1 + 1.0/2048, 1}, {1 + 3.0/2048, 1 + 2.0/1024}, {65504, 65504}, {70000, float32(math.Inf(1))},
		{-3.0 / (1 << 25), -2.0 / (1 << 24)}, {1.0 / (1 << 25), 0}, {0.1, 0.0999755859375},
	} {
		if got := f16Round(c.in); got != c.want {
			t.Errorf("f16Round(%g) = %g, want %g", c.in, got, c.want)
		}
	}
}

// The one-part GEMM's scratch holds the split of every linear input a
// forward of M rows can hand it: every fp8 linear of both presets (main and
// MTP layers, their real in-dims) and the expert down projection's pairs.
func TestGemmScratchCovers(t *testing.T) {
	for _, pr := range enginetest.Presets {
		t.Run(pr, func(t *testing.T) {
			_, src := hfSourceOf(t, enginetest.PresetDir(t, pr))
			ge := newTestEngine(t, onEmu, src, engine.Options{MaxSeqLen: maxSeq, MTP: true})
			c := ge.m.cfg
			const M = 48
			have := gemmScratchBytes(c, M)
			seen := 0
			for _, lw := range ge.m.w.layers {
				v := reflect.ValueOf(lw.Block).Elem()
				for i := 0; i < v.NumField(); i++ {
					l, ok := v.Field(i).Interface().(dlin)
					if !ok || l.kind != linFP8 || l.in == 0 {
						continue
					}
					seen++
					if need := kernels.GemmP1ScratchBytes(M, l.in); need > have {
						t.Errorf("layer %d %s: %d inputs need %d scratch bytes, have %d", lw.Idx, v.Type().Field(i).Name, l.in, need, have)
					}
				}
			}
			if seen == 0 {
				t.Fatal("no fp8 linear found")
			}
			if need := kernels.GemmP1ScratchBytes(M*c.NumExpertsPerTok, c.MoEIntermediateSize); need > have {
				t.Errorf("expert pairs need %d scratch bytes, have %d", need, have)
			}
		})
	}
}

// TestPickChunk pins pickChunk on the deepseek-v3.2-moe shape (issue 10's
// prefill command): with the GEMMs on a 141 GB GPU an 8192-token prompt
// runs as one chunk; a smaller one gets the largest power of two whose
// workspace fits a quarter of it; the environment and sharded engines keep
// their chunks; never more than max_seq_len (rounded to 256).
func TestPickChunk(t *testing.T) {
	p, err := synth.Lookup("deepseek-v3.2-moe")
	if err != nil {
		t.Fatal(err)
	}
	b, err := synth.Build(p, 0)
	if err != nil {
		t.Fatal(err)
	}
	old := gemmOn
	t.Cleanup(func() { gemmOn = old })
	gemmOn = true
	for _, c := range []struct {
		mem    int64
		maxSeq int
		env    string
		want   int
	}{
		{141 << 30, 8200, "", 8192},
		{141 << 30, 1100, "", 1280},
		{141 << 30, 131072, "", 8192},
		{80 << 30, 131072, "", 4096},
		{40 << 30, 8200, "", 4096},
		{16 << 30, 8200, "", 1024},
		{141 << 30, 8200, "512", 512},
	} {
		t.Setenv("TILERT_GPU_PREFILL_CHUNK", c.env)
		e := &backend{cfg: b.Config, maxSeq: c.maxSeq, r: &cudaRunner{info: cuda.DeviceInfo{TotalMem: c.mem}}}
		got := e.pickChunk(nil)
		t.Logf("mem %d GiB, max_seq %d: chunk %d, workspace %.2f GB", c.mem>>30, c.maxSeq, got, float64(workspaceBytes(e, got))/1e9)
		if got != c.want {
			t.Errorf("mem %d GiB, max_seq %d, env %q: chunk %d, want %d", c.mem>>30, c.maxSeq, c.env, got, c.want)
		}
	}
}

// TestExpertOrder: the grouped MoE's counting sort gives the order the
// stable comparison sort gave (by expert, then by pair index), on random,
// skewed and single-expert routings, with its buffers reused across calls
// of different sizes; an expert id outside [0, E) is refused.
func TestExpertOrder(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 9))
	var bufs expertOrderBufs
	for _, c := range []struct{ P, E, hot int }{{65536, 256, 0}, {8, 4, 0}, {4096, 256, 3}, {1, 1, 0}, {777, 160, 1}, {48 * 8, 16, 0}} {
		ids := make([]int32, c.P)
		for i := range ids {
			ids[i] = int32(rng.IntN(c.E))
			if c.hot > 0 && rng.IntN(2) == 0 {
				ids[i] = int32(rng.IntN(c.hot)) // most pairs on a few experts
			}
		}
		want := make([]int, c.P)
		for i := range want {
			want[i] = i
		}
		slices.SortStableFunc(want, func(p, q int) int { return int(ids[p]) - int(ids[q]) })
		pairs, eid, err := expertOrder(ids, c.E, &bufs)
		if err != nil {
			t.Fatal(err)
		}
		if len(pairs) != c.P || len(eid) != c.P {
			t.Fatalf("P=%d: %d pairs, %d experts", c.P, len(pairs), len(eid))
		}
		for i := range want {
			if int(pairs[i]) != want[i] || eid[i] != ids[want[i]] {
				t.Fatalf("P=%d E=%d: place %d holds pair %d (expert %d), want pair %d (expert %d)", c.P, c.E, i, pairs[i], eid[i], want[i], ids[want[i]])
			}
		}
	}
	for _, bad := range []int32{-1, 16} {
		if _, _, err := expertOrder([]int32{0, bad, 3}, 16, &bufs); err == nil {
			t.Errorf("expert id %d of 16 accepted", bad)
		}
	}
}

// BenchmarkExpertOrder: the host's share of an 8192-row chunk's grouped
// MoE (65536 pairs of 256 experts).
func BenchmarkExpertOrder(b *testing.B) {
	rng := rand.New(rand.NewPCG(1, 2))
	ids := make([]int32, 65536)
	for i := range ids {
		ids[i] = int32(rng.IntN(256))
	}
	var bufs expertOrderBufs
	for b.Loop() {
		if _, _, err := expertOrder(ids, 256, &bufs); err != nil {
			b.Fatal(err)
		}
	}
}
