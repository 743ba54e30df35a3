package kernels

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/tilert-go/tilert/cuda"
)

// TestKernelGemvAddNorm: the fused o_proj + add-norm (cu/oproj_norm.cu)
// against GemvFP8Tile on the same plan then AddRMSNorm, on fresh random
// inputs: the GEMV's output, the residual and the normed row bit for bit,
// twice in a row (the tile counter read back zero after each), on every
// plan it has a kernel for (the strided _d16s too), capped grids, both
// models' o_proj shapes and rows of the tiny presets' widths (norm threads
// played 1..4 to a thread). Fails unless the fused kernel launched.
func TestKernelGemvAddNorm(t *testing.T) {
	defer func(r int) { TileRule = r }(TileRule)
	defer func() { forceTileG, forceTileR, forceTileV, forceTileB = 0, 0, "", 0 }()
	onGPU(t, func(c *cuda.Ctx, k *Set, a *allocs, r *rand.Rand) {
		s := c.Stream()
		cnt := a.up([]int32{0})
		before := GemvAddNormLaunches()
		type cfg struct {
			N, K int
			G, R int
			v    string
			B    int
		}
		for _, cf := range []cfg{
			{7168, 16384, 0, 0, "", 0},       // DeepSeek-V3.2's o_proj, the rule's plan
			{6144, 16384, 64, 8, "_d16s", 0}, // GLM-5's, on its spread plan
			{7168, 16384, 64, 8, "_d16", 0},
			{6144, 16384, 64, 4, "_d16s", 3},
			{2048, 4096, 128, 8, "_o4", 0},
			{1024, 512, 32, 4, "-", 0},
			{256, 128, 32, 4, "_o4", 0}, // a tiny preset's row: 64 norm threads
			{2048, 1024, 64, 8, "_d16", -5},
			{5120, 2048, 64, 4, "_d16", 0}, // 1024 norm threads, 5 values each
			{160, 128, 32, 1, "-", 0},      // the tiny presets' o_proj plans (64 and 96 norm threads)
			{288, 192, 32, 1, "-", 0},
			{288, 192, 32, 2, "_d16", 0},
			{2048, 512, 64, 2, "-", 0},
		} {
			tag := fmt.Sprintf("N=%d K=%d G=%d R=%d%s B=%d", cf.N, cf.K, cf.G, cf.R, cf.v, cf.B)
			t.Run(strings.ReplaceAll(tag, " ", "_"), func(t *testing.T) {
				TileRule = 3
				forceTileG, forceTileR, forceTileV, forceTileB = cf.G, cf.R, cf.v, cf.B
				defer func() { forceTileG, forceTileR, forceTileV, forceTileB = 0, 0, "", 0 }()
				if cf.v == "_d16s" {
					// the spread plan is a pin (tile_plan.go), not a forced variant
					forceTileG, forceTileR, forceTileV = 0, 0, ""
					prev := k.SetTilePlan(cf.N, cf.K, TilePlan{G: cf.G, R: cf.R, V: "_d16s", B: cf.B})
					defer k.SetTilePlan(cf.N, cf.K, prev)
				}
				N, K := cf.N, cf.K
				name, _, _, total := k.GemvAddNormKernel(N, K, a.raw(int64(4*K)), a.raw(int64(N*K)))
				if name == "" {
					t.Fatalf("no fused kernel for %s", tag)
				}
				t.Logf("%s: %s, %d tiles", tag, name, total)
				w, sc := a.up(randFP8(r, N*K)), a.up(randScales(r, cdiv(N, 128)*cdiv(K, 128), -6))
				x := a.up(randF32(r, K, 1))
				res, nw := randF32(r, N, 3), a.up(randF32(r, N, 1))
				y1, res1, h1 := a.poisoned(N), a.up(res), a.poisoned(N)
				chk(k.GemvFP8Tile(s, y1, x, w, sc, 0, N, K, 1, K, N))
				chk(k.AddRMSNorm(s, h1, res1, y1, nw, 1, N, N, N, N, 1e-6))
				want := [][]byte{bytesF32(downF32(c, y1, N)), bytesF32(downF32(c, res1, N)), bytesF32(downF32(c, h1, N))}
				for round := range 2 {
					y2, res2, h2 := a.poisoned(N), a.up(res), a.poisoned(N)
					chk(k.GemvAddNorm(s, GemvAddNorm{W: w, S: sc, X: x, Y: y2, N: N, K: K, Res: res2, Norm: nw, H: h2, Eps: 1e-6, Cnt: cnt}))
					got := [][]byte{bytesF32(downF32(c, y2, N)), bytesF32(downF32(c, res2, N)), bytesF32(downF32(c, h2, N))}
					bad := 0
					for i := range want {
						bad += diffBytes(want[i], got[i])
					}
					var left [1]int32
					chk(c.Download(left[:], cnt))
					if left[0] != 0 {
						bad++
					}
					record(t, fmt.Sprintf("o_proj + add-norm (%s) vs tile GEMV + add_rmsnorm, round %d, %s", name, round, tag),
						"mismatched bytes + a nonzero tile counter", float64(bad), 0)
				}
			})
		}
		if GemvAddNormLaunches() == before {
			t.Fatal("the fused o_proj + add-norm kernel never launched")
		}
	})
}

// TestGemvAddNormCheck: what the launcher refuses, before any launch.
func TestGemvAddNormCheck(t *testing.T) {
	const p = cuda.DevPtr(1 << 20)
	testRefusals(t, func() GemvAddNorm {
		return GemvAddNorm{W: p, S: p, X: p, Y: p, N: 7168, K: 16384, Res: p, Norm: p, H: p, Eps: 1e-6, Cnt: p}
	}, (*GemvAddNorm).Check, []refusal[GemvAddNorm]{
		{"K not x16", func(a *GemvAddNorm) { a.K = 16388 }, "multiple of 16"},
		{"a row past the register norm", func(a *GemvAddNorm) { a.N = 1024 * 9 }, "add_rmsnorm_reg"},
		{"unaligned W", func(a *GemvAddNorm) { a.W = p + 4 }, "aligned"},
		{"no residual", func(a *GemvAddNorm) { a.Res = 0 }, "residual"},
		{"no norm weights", func(a *GemvAddNorm) { a.Norm = 0 }, "norm weights"},
		{"no counter", func(a *GemvAddNorm) { a.Cnt = 0 }, "counter"},
	})
}

// TestGemvAddNormKernelsDefined: every plain plan GemvAddNormKernel maps
// and its fused twin are in the module, launched as the plain twin is
// (programmatically, or plainly for _d16s unless TILERT_GPU_PDL_MORE names
// it).
func TestGemvAddNormKernelsDefined(t *testing.T) { testTwinsDefined(t, gemvAddNormKernels, "_an", 11) }

// TestKernelTimingGemvAddNorm (TILERT_GPU_TIMING=1): the fused o_proj +
// add-norm against its two launches (GemvFP8Tile, then AddRMSNorm) and
// o_proj alone, at both models' shapes on the engine's plans (GLM-5's
// o_proj on SpreadPlan's, as the engine pins it), direct and inside a CUDA
// graph, beside a device copy of 256 MiB; bytes are o_proj's weights.
func TestKernelTimingGemvAddNorm(t *testing.T) {
	needTiming(t)
	onGPU(t, func(c *cuda.Ctx, k *Set, a *allocs, r *rand.Rand) {
		s := c.Stream()
		add := timingTable(t, c, a, r, 256<<20, "o_proj + add-norm: device-to-device copy 256 MiB (read+write)", "reference of this table")
		both := func(name string, bytes float64, f func()) {
			add(name+" direct", bytes, medianUs(c, s, 20, 21, f), "")
			add(name+" graph", bytes, graphUs(c, s, 20, f), "")
		}
		cnt := a.up([]int32{0})
		for _, sh := range []struct {
			name   string
			N, K   int
			spread bool
		}{{"DeepSeek-V3.2 7168x16384", 7168, 16384, false}, {"GLM-5 6144x16384", 6144, 16384, true}} {
			N, K := sh.N, sh.K
			if p := k.SpreadPlan(N, K); sh.spread && p.On() {
				prev := k.SetTilePlan(N, K, p)
				defer k.SetTilePlan(N, K, prev)
			}
			w, sc := a.up(randFP8(r, N*K)), a.up(randScales(r, cdiv(N, 128)*cdiv(K, 128), -6))
			x, y, res, h := a.up(randF32(r, K, 1)), a.raw(int64(4*N)), a.up(randF32(r, N, 1)), a.raw(int64(4*N))
			nw := a.up(randF32(r, N, 1))
			name, _, _, _ := k.GemvAddNormKernel(N, K, x, w)
			bytes := float64(N*K + 4*cdiv(N, 128)*cdiv(K, 128))
			both(sh.name+" o_proj alone", bytes, func() { chk(k.GemvFP8Tile(s, y, x, w, sc, 0, N, K, 1, K, N)) })
			both(sh.name+" o_proj + add_rmsnorm", bytes, func() {
				chk(k.GemvFP8Tile(s, y, x, w, sc, 0, N, K, 1, K, N))
				chk(k.AddRMSNorm(s, h, res, y, nw, 1, N, N, N, N, 1e-6))
			})
			both(sh.name+" "+name, bytes, func() {
				chk(k.GemvAddNorm(s, GemvAddNorm{W: w, S: sc, X: x, Y: y, N: N, K: K, Res: res, Norm: nw, H: h, Eps: 1e-6, Cnt: cnt}))
			})
		}
	})
}
