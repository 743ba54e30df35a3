package kernels

import (
	"fmt"
	"math"
	"math/rand/v2"
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
			// Not t.Run: a subtest runs off the device thread, where the
			// context is not current.
			func(t *testing.T) {
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
				name, _, gx := k.GemvAddNormKernel(N, K, a.raw(int64(4*K)), a.raw(int64(N*K)))
				if name == "" {
					t.Fatalf("no fused kernel for %s", tag)
				}
				t.Logf("%s: %s, %d blocks", tag, name, gx)
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
			}(t)
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
		both := directAndGraph(c, s, add)
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
			name, _, _ := k.GemvAddNormKernel(N, K, x, w)
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

// addNormRow transcribes add_rmsnorm_row (norm.cu) for one row: nt threads,
// thread t's elements t + j*nt (j < normRegs), each warp's sums by xor
// butterflies, the warp partials summed in order; fma as the GPU contracts
// ss += v*v. It returns x + b and the normed row.
func addNormRow(x, b, w []float32, nt int, eps float32) (xo, y []float32) {
	D := len(x)
	xo, y = make([]float32, D), make([]float32, D)
	ss := make([]float32, nt)
	for t := range nt {
		for j := range normRegs {
			if i := t + j*nt; i < D {
				v := x[i] + b[i]
				xo[i] = v
				ss[t] = float32(math.FMA(float64(v), float64(v), float64(ss[t])))
			}
		}
	}
	sh := make([]float32, nt/32)
	for wp := range nt / 32 {
		sh[wp] = warpSumF32(ss[32*wp : 32*wp+32])
	}
	r := float32(0)
	for _, p := range sh {
		r += p
	}
	rr := float32(1 / math.Sqrt(float64(r/float32(D)+eps)))
	for i := range D {
		y[i] = w[i] * (xo[i] * rr)
	}
	return xo, y
}

// warpSumF32 is warp_sum's xor butterfly over 32 lanes; lane 0's result.
func warpSumF32(lanes []float32) float32 {
	v := append([]float32(nil), lanes...)
	for o := 16; o > 0; o >>= 1 {
		n := make([]float32, 32)
		for l := range 32 {
			n[l] = v[l] + v[l^o]
		}
		v = n
	}
	return v[0]
}

// addNormPlayed transcribes oproj_norm.cu's add_rmsnorm_played: the block's
// tileThreads threads playing nt, in its loops and indices.
func addNormPlayed(x, b, w []float32, nt int, eps float32) (xo, y []float32) {
	D := len(x)
	xo, y = append([]float32(nil), x...), make([]float32, D)
	sh := make([]float32, 32)
	for q := 0; q*tileThreads < nt; q++ {
		ss := make([]float32, tileThreads) // thread t's sum this trip
		for t := range tileThreads {
			vt := t + q*tileThreads
			if vt >= nt {
				continue
			}
			for j := range normRegs {
				if i := vt + j*nt; i < D {
					v := xo[i] + b[i]
					xo[i] = v
					ss[t] = float32(math.FMA(float64(v), float64(v), float64(ss[t])))
				}
			}
		}
		for wp := range tileThreads / 32 {
			s := warpSumF32(ss[32*wp : 32*wp+32])
			if vt := 32*wp + q*tileThreads; vt < nt { // lane 0's vt
				sh[vt>>5] = s
			}
		}
	}
	r := float32(0)
	for i := 0; i < nt>>5; i++ {
		r += sh[i]
	}
	rr := float32(1 / math.Sqrt(float64(r/float32(D)+eps)))
	for q := 0; q*tileThreads < nt; q++ {
		for t := range tileThreads {
			vt := t + q*tileThreads
			if vt >= nt {
				continue
			}
			for j := range normRegs {
				if i := vt + j*nt; i < D {
					y[i] = w[i] * (xo[i] * rr)
				}
			}
		}
	}
	return xo, y
}

// TestAddNormPlayedOrder (no GPU): add_rmsnorm_played's loops, transcribed,
// give add_rmsnorm_row's x and y bit for bit on every row width the
// register norm takes from 1 to 8192 values (norm threads 32..1024, played
// 1..4 to a thread), on random rows.
func TestAddNormPlayedOrder(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 2))
	for _, D := range []int{1, 31, 64, 128, 160, 288, 1000, 1024, 2048, 4096, 5120, 6144, 7168, 8192} {
		if !normRegsFit(D) {
			t.Fatalf("D=%d does not fit the register norm", D)
		}
		nt := normThreads(D)
		x, b, w := randF32(r, D, 3), randF32(r, D, 2), randF32(r, D, 1)
		x1, y1 := addNormRow(x, b, w, nt, 1e-6)
		x2, y2 := addNormPlayed(x, b, w, nt, 1e-6)
		if n := diffF32Bits(x1, x2) + diffF32Bits(y1, y2); n != 0 {
			t.Errorf("D=%d (%d norm threads): %d values differ", D, nt, n)
		}
	}
}
