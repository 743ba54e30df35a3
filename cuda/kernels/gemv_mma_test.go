package kernels

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/tilert-go/tilert/cuda"
)

// TestKernelGemvMMA checks the tensor-core GEMVs (fp8 and bf16 weights,
// gate/up/SwiGLU paired) for every row count 1..8 and every compiled row
// tile / chunk depth (bf16: those compiled for it) against the float64
// reference on fresh random inputs, odd row counts and padded x rows
// included, and that two runs agree bit for bit.
func TestKernelGemvMMA(t *testing.T) {
	defer func() { forceMMART, forceMMAU, forceMMAP, forceMMAX = 0, 0, -1, -1 }()
	// The launcher's choice (RT 0: nothing pinned), then every variant.
	cfgs := append([]mmaVariant{{0, 0, -1, false}}, mmaAllVariants()...)
	for _, cf := range cfgs {
		tag := fmt.Sprintf(" RT=%d U=%d P=%d X=%v", cf.RT, cf.U, cf.P, cf.X)
		t.Run(fmt.Sprintf("RT%d_U%d_P%d_X%v", cf.RT, cf.U, cf.P, cf.X), func(t *testing.T) {
			forceMMART, forceMMAU, forceMMAP, forceMMAX = cf.RT, cf.U, cf.P, b2i(cf.X)
			if cf.RT == 0 {
				forceMMAX = -1
			}
			onGPU(t, func(c *cuda.Ctx, k *Set, a *allocs, r *rand.Rand) {
				if !k.MMAOK(a.raw(64), a.raw(64), 64, 64, 1, 1) {
					t.Skip("no bf16 mma.sync on this device")
				}
				s := c.Stream()
				Ms := []int{1, 2, 3, 4, 5, 6, 7, 8}
				if cf.RT != 0 {
					Ms = []int{2, 7} // pinned variants: fewer row counts
				}
				for _, M := range Ms {
					for _, cs := range []gemvCase{{300, 1536, M, 0, M%2 == 0}, {129, 2048, M, 8, M == 3}, {16, 7168, M, 0, false},
						{160, 288, M, 0, M == 2}, {96, 160, M, 4, false}, {40, 16, M, 0, true}} {
						checkGemvFP8(t, c, a, r, k.GemvFP8MMA, cs, "gemv_mma_fp8 "+cs.dims()+tag, true)
					}
					bf := []gemvCase{{77, 1024, M, 4, M == 5}, {1024, 160, M, 0, false}, {33, 8, M, 0, false}}
					if cf.RT == 0 {
						bf = append(bf, gemvCase{520, 7168, M, 0, false})
					} else if !mmaCompiled(cf, true) {
						bf = nil // an fp8-only variant
					}
					for _, cs := range bf {
						checkGemvBF16(t, c, a, r, k.GemvBF16MMA, cs, "gemv_mma_bf16 "+cs.dims()+tag)
					}
					for _, cs := range []gemvCase{{130, 2048, M, 4, false}, {64, 7168, M, 0, false}, {96, 160, M, 0, false}} {
						N, K := cs.N, cs.K
						ldx := K + cs.pad
						wg, wu := randFP8(r, N*K), randFP8(r, N*K)
						sg, su := randScales(r, cdiv(N, 128)*cdiv(K, 128), -8), randScales(r, cdiv(N, 128)*cdiv(K, 128), -8)
						x := randF32(r, M*ldx, 1)
						yp := a.poisoned(M * N)
						chk(k.GateUpFP8MMA(s, yp, a.up(x), a.up(wg), a.up(sg), a.up(wu), a.up(su), N, K, M, ldx, N))
						ref := refSiluMul(refGemv(fp8At(wg, sg, K), x, nil, N, K, M, ldx, N), refGemv(fp8At(wu, su, K), x, nil, N, K, M, ldx, N))
						record(t, fmt.Sprintf("gate_up_mma N=%d K=%d M=%d ldx=%d", N, K, M, ldx)+tag, relMetric, relErr(downF32(c, yp, M*N), ref), boundF32)
					}
				}
				// Rows of very different magnitude: the three parts carry every
				// bit of each x value whatever its exponent.
				N, K, M := 200, 2048, 4
				w := randFP8(r, N*K)
				sc := randScales(r, cdiv(N, 128)*cdiv(K, 128), -8)
				x := randF32(r, M*K, 1)
				for i := range x {
					switch i / K {
					case 1:
						x[i] *= 3e4
					case 2:
						x[i] *= 1e-7
					case 3:
						if i%5 == 0 {
							x[i] *= 1e6
						}
					}
				}
				yp := a.poisoned(M * N)
				chk(k.GemvFP8MMA(s, yp, a.up(x), a.up(w), a.up(sc), 0, N, K, M, K, N))
				got := downF32(c, yp, M*N)
				ref := refGemv(fp8At(w, sc, K), x, nil, N, K, M, K, N)
				for m := range M {
					record(t, fmt.Sprintf("gemv_mma_fp8 wide-range x row %d N=%d K=%d M=%d", m, N, K, M)+tag, relMetric,
						relErr(got[m*N:(m+1)*N], ref[m*N:(m+1)*N]), boundF32)
				}
				// K not whole 16-byte pieces: the tile GEMV's fallback takes it.
				checkGemvFP8(t, c, a, r, k.GemvFP8MMA, gemvCase{50, 100, 3, 0, true}, "gemv_mma_fp8 fallback N=50 K=100 M=3"+tag, true)
			})
		})
	}
}

// TestKernelGemvGroupMMA checks the grouped tensor-core GEMV (fp8 and bf16
// segments of one input) against the float64 reference on fresh random
// inputs, and that two runs agree bit for bit.
func TestKernelGemvGroupMMA(t *testing.T) {
	defer func() { forceMMAU = 0 }()
	onGPU(t, func(c *cuda.Ctx, k *Set, a *allocs, r *rand.Rand) {
		if !k.MMAOK(a.raw(64), a.raw(64), 64, 64, 1, 1) {
			t.Skip("no bf16 mma.sync on this device")
		}
		s := c.Stream()
		type segc struct {
			N    int
			bf16 bool
		}
		// U: 0 the launcher's choice (u4), 2 u2, 4 u4 pinned.
		for _, cs := range []struct {
			K, M, pad, U int
			segs         []segc
		}{
			{1024, 1, 0, 0, []segc{{300, false}, {96, false}, {40, false}, {17, true}}},
			{1024, 2, 4, 0, []segc{{300, false}, {96, false}, {40, false}, {17, true}}},
			{160, 4, 0, 2, []segc{{96, false}, {33, true}}},
			{160, 3, 0, 0, []segc{{96, false}, {33, true}}},
			{1024, 7, 0, 2, []segc{{17, true}, {300, false}}},
			{1024, 7, 0, 0, []segc{{17, true}, {300, false}}},
			{1024, 8, 8, 0, []segc{{300, false}, {96, false}, {40, false}, {17, true}}},
			{7168, 4, 0, 0, []segc{{1536, false}, {576, false}, {128, false}, {64, true}}},
			{1024, 3, 4, 2, []segc{{300, false}, {96, false}, {40, false}, {17, true}}},
			{7168, 4, 0, 2, []segc{{1536, false}, {576, false}, {128, false}, {64, true}}},
			{7168, 8, 0, 4, []segc{{1536, false}, {576, false}, {128, false}, {64, true}}},
			{1024, 5, 0, 4, []segc{{300, false}, {96, false}, {40, false}, {17, true}}},
		} {
			forceMMAU = cs.U
			K, M := cs.K, cs.M
			ldx := K + cs.pad
			x := randF32(r, M*ldx, 1)
			xp := a.up(x)
			segs := make([]GroupSeg, len(cs.segs))
			refs := make([][]float64, len(cs.segs))
			for i, sc := range cs.segs {
				N := sc.N
				if sc.bf16 {
					w := randBF16(r, N*K, 0.05)
					segs[i] = GroupSeg{W: a.up(w), N: N, LdY: N, BF16: true}
					refs[i] = refGemv(func(n, kk int) float64 { return bf16ToF64(w[n*K+kk]) }, x, nil, N, K, M, ldx, N)
				} else {
					w, scl := randFP8(r, N*K), randScales(r, cdiv(N, 128)*cdiv(K, 128), -8)
					segs[i] = GroupSeg{W: a.up(w), S: a.up(scl), N: N, LdY: N}
					refs[i] = refGemv(fp8At(w, scl, K), x, nil, N, K, M, ldx, N)
				}
			}
			var first [][]float32
			for rep := range 2 {
				for i := range segs {
					segs[i].Y = a.poisoned(M * segs[i].N)
				}
				chk(k.GemvGroupMMA(s, xp, K, M, ldx, segs))
				for i, sg := range segs {
					got := downF32(c, sg.Y, M*sg.N)
					name := fmt.Sprintf("gemv_group_mma K=%d M=%d ldx=%d U=%d segment %d N=%d bf16=%v", K, M, ldx, cs.U, i, sg.N, sg.BF16)
					if rep == 0 {
						first = append(first, got)
						record(t, name, relMetric, relErr(got, refs[i]), boundF32)
					} else {
						record(t, name+" repeat", "differing outputs", float64(diffCount(got, first[i])), 0)
					}
				}
			}
		}
	})
}

// TestMMAShape pins the launcher's choice on the decode shapes (132 SMs),
// and that a pinned variant (tests, sweeps) runs itself, or a compiled
// kernel of its generation where the shape forbids it (the pair's two
// row tiles), or bf16's r2 u1 where it is compiled for fp8 only.
func TestMMAShape(t *testing.T) {
	defer func(r1 bool) { MMARun1 = r1 }(MMARun1)
	defer func() { forceMMART, forceMMAU, forceMMAP, forceMMAX = 0, 0, -1, -1 }()
	p := mmaVariant{2, 1, 1, true}
	for _, cs := range []struct {
		N, kbytes        int
		bf16, pair, run1 bool
		want             mmaVariant
	}{
		{7168, 16384, false, false, false, p},                           // o_proj
		{7168, 18432, false, false, false, p},                           // dense down
		{24576, 1536, false, false, false, mmaVariant{4, 1, 0, false}},  // q_b
		{8192, 1536, false, false, false, p},                            // indexer wq_b
		{1536, 7168, false, false, false, mmaVariant{1, 4, 0, false}},   // q_a alone
		{18432, 7168, false, true, false, p},                            // dense gate/up
		{129280, 14336, true, false, false, mmaVariant{2, 1, 0, false}}, // head
		{7168, 16384, false, false, true, mmaVariant{2, 2, 0, false}},
		{7168, 18432, false, false, true, mmaVariant{2, 2, 0, false}},
		{24576, 1536, false, false, true, mmaVariant{4, 1, 0, false}},
		{8192, 1536, false, false, true, mmaVariant{2, 1, 0, false}},
		{1536, 7168, false, false, true, mmaVariant{1, 4, 0, false}},
		{18432, 7168, false, true, true, mmaVariant{4, 1, 0, false}},
		{129280, 14336, true, false, true, mmaVariant{2, 1, 0, false}},
	} {
		MMARun1 = cs.run1
		v := mmaShape(132, cs.N, cs.kbytes, cs.bf16, cs.pair)
		if v != cs.want {
			t.Errorf("N=%d kbytes=%d bf16=%v pair=%v run1=%v: %+v, want %+v", cs.N, cs.kbytes, cs.bf16, cs.pair, cs.run1, v, cs.want)
		}
		if !mmaCompiled(v, cs.bf16) {
			t.Errorf("N=%d: %+v not compiled", cs.N, v)
		}
		for _, pin := range mmaAllVariants() {
			forceMMART, forceMMAU, forceMMAP, forceMMAX = pin.RT, pin.U, pin.P, b2i(pin.X)
			v := mmaShape(132, cs.N, cs.kbytes, cs.bf16, cs.pair)
			want := pin
			if !mmaCompiled(pin, cs.bf16) {
				want = mmaVariant{2, 1, 0, false} // bf16's fallback for an fp8-only pin
			}
			if !mmaCompiled(v, cs.bf16) || v.X != want.X || (v != want && (!cs.pair || pin.RT >= 2)) {
				t.Errorf("N=%d bf16=%v pair=%v run1=%v pinned %+v: %+v, want %+v", cs.N, cs.bf16, cs.pair, cs.run1, pin, v, want)
			}
		}
		forceMMART, forceMMAU, forceMMAP, forceMMAX = 0, 0, -1, -1
	}
}

// TestKernelMMAVariantsBitwise: every variant of one generation runs each
// warp's chunks in the same order with the same arithmetic per row tile,
// so it must write the same floats, bit for bit, as the launcher's choice
// (fp8, paired gate/up and bf16, fresh random inputs): the engine checks
// of one variant hold for all of them. gemv_mma_x.cu has one GEMV variant
// left since session 19 (its pass compares it with the launcher's choice,
// itself).
func TestKernelMMAVariantsBitwise(t *testing.T) {
	defer func() { forceMMART, forceMMAU, forceMMAP, forceMMAX = 0, 0, -1, -1 }()
	onGPU(t, func(c *cuda.Ctx, k *Set, a *allocs, r *rand.Rand) {
		if !k.MMAOK(a.raw(64), a.raw(64), 64, 64, 1, 1) {
			t.Skip("no bf16 mma.sync on this device")
		}
		s := c.Stream()
		const N, K, M = 1000, 2048, 5
		w8, sc := a.up(randFP8(r, N*K)), a.up(randScales(r, cdiv(N, 128)*cdiv(K, 128), -8))
		wu, su := a.up(randFP8(r, N*K)), a.up(randScales(r, cdiv(N, 128)*cdiv(K, 128), -8))
		wb := a.up(randBF16(r, N*K, 0.05))
		x := a.up(randF32(r, M*K, 1))
		run := func() [3][]float32 {
			var out [3][]float32
			for i := range out {
				y := a.poisoned(M * N)
				switch i {
				case 0:
					chk(k.GemvFP8MMA(s, y, x, w8, sc, 0, N, K, M, K, N))
				case 1:
					chk(k.GateUpFP8MMA(s, y, x, w8, sc, wu, su, N, K, M, K, N))
				case 2:
					chk(k.GemvBF16MMA(s, y, x, wb, 0, N, K, M, K, N))
				}
				out[i] = downF32(c, y, M*N)
			}
			return out
		}
		for _, gen := range [][]mmaVariant{slices.Concat(mmaVariants, mmaFP8Variants), mmxVariants} {
			forceMMART, forceMMAU, forceMMAP, forceMMAX = 0, 0, -1, b2i(gen[0].X)
			ref := run()
			for _, v := range gen {
				forceMMART, forceMMAU, forceMMAP = v.RT, v.U, v.P
				got := run()
				for i, what := range []string{"fp8", "gate/up", "bf16"} {
					if i == 2 && !mmaCompiled(v, true) {
						continue // fp8 only
					}
					record(t, fmt.Sprintf("gemv mma variant %s == launcher's choice: %s N=%d K=%d M=%d", v.name(i == 2), what, N, K, M),
						"differing outputs", float64(diffCount(got[i], ref[i])), 0)
				}
			}
		}
	})
}
