package kernels

import (
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/tilert-go/tilert/cuda"
)

// TestKernelGemvGroup checks the grouped GEMV (fp8 and bf16 segments of odd
// row counts, partial 128-row scale blocks, 1..8 input rows, padded x rows,
// with and without the RMSNorm prologue) against the float64 reference on
// fresh random inputs, against the separate launches it replaces (RMSNorm,
// then GemvFP8Tile / GemvBF16Tile per segment: bit for bit; bf16 segments
// of fewer than GemvBF16TileMinM rows have no tile kernel to match and are
// checked against the float64 reference alone), and run to run (bit for
// bit), under both tile rules. The separate launches keep their own rows
// per group (1..8) where the grouped one takes 8 (4 at 8 input rows): the
// bits must not depend on it.
func TestKernelGemvGroup(t *testing.T) {
	defer func(r int) { TileRule = r }(TileRule)
	for _, rule := range []int{1, 3} {
		t.Run(fmt.Sprintf("rule=%d", rule), func(t *testing.T) {
			TileRule = rule
			testGemvGroup(t, fmt.Sprintf(" rule=%d", rule))
		})
	}
	// The norm prologue's loop form (TILERT_GPU_SMALL=0).
	t.Run("rule=3_loop_norm", func(t *testing.T) {
		TileRule = 3
		withSmall(false, func() { testGemvGroup(t, " rule=3 loop norm") })
	})
}

type groupSegCase struct {
	N    int
	bf16 bool
}

type groupCase struct {
	K, M, pad int
	norm      bool
	segs      []groupSegCase
}

func testGemvGroup(t *testing.T, tag string) {
	onGPU(t, func(c *cuda.Ctx, k *Set, a *allocs, r *rand.Rand) {
		s := c.Stream()
		for _, gc := range []groupCase{
			// The attention inputs of a layer (scaled down): q_a, kv_a (576:
			// a partial scale block), indexer wk, weights_proj (bf16).
			{K: 7168, M: 1, segs: []groupSegCase{{1536, false}, {576, false}, {128, false}, {64, true}}},
			{K: 2048, M: 3, pad: 4, segs: []groupSegCase{{301, false}, {77, true}, {130, false}}},
			{K: 1024, M: 8, segs: []groupSegCase{{200, true}, {129, false}, {9, false}, {33, true}}},
			{K: 512, M: 5, segs: []groupSegCase{{1, false}}},
			// q_b and indexer wq_b over the normed q_a.
			{K: 1536, M: 1, norm: true, segs: []groupSegCase{{3000, false}, {1027, false}}},
			{K: 1536, M: 2, pad: 8, norm: true, segs: []groupSegCase{{515, false}, {256, false}}},
			{K: 1536, M: 7, norm: true, segs: []groupSegCase{{131, false}, {64, true}, {300, false}}},
			{K: 768, M: 4, norm: true, segs: []groupSegCase{{257, false}}},
			// the layer input with its norm (the input norm in the prologue)
			{K: 7168, M: 1, norm: true, segs: []groupSegCase{{1536, false}, {576, false}, {128, false}, {64, true}}},
			{K: 7168, M: 3, pad: 4, norm: true, segs: []groupSegCase{{300, false}, {64, true}}},
			{K: 7168, M: 4, norm: true, segs: []groupSegCase{{1536, false}, {576, false}, {128, false}, {64, true}}},
			{K: 6144, M: 2, pad: 4, norm: true, segs: []groupSegCase{{2048, false}, {576, false}, {128, false}, {32, true}}},
			{K: 8320, M: 1, norm: true, segs: []groupSegCase{{130, false}}},
		} {
			K, M := gc.K, gc.M
			ldx := K + gc.pad
			x := randF32(r, M*ldx, 1)
			xp := a.up(x)
			var norm GroupNorm
			xref := x // what the segments multiply (float32)
			xsep := xp
			if gc.norm {
				nw := randF32(r, K, 1)
				norm = GroupNorm{W: a.up(nw), Eps: 1e-6}
				xn := a.poisoned(M * ldx)
				chk(k.RMSNorm(s, xn, xp, norm.W, M, K, ldx, ldx, norm.Eps))
				xsep = xn
				xref = make([]float32, M*ldx)
				for m := range M {
					var ss float64
					for i := range K {
						v := float64(x[m*ldx+i])
						ss += v * v
					}
					inv := 1 / math.Sqrt(ss/float64(K)+float64(norm.Eps))
					for i := range K {
						xref[m*ldx+i] = float32(float64(x[m*ldx+i]) * inv * float64(nw[i]))
					}
				}
			}
			segs := make([]GroupSeg, len(gc.segs))
			refs := make([][]float64, len(gc.segs))
			seps := make([][]float32, len(gc.segs))
			for i, sc := range gc.segs {
				N := sc.N
				ldy := N + 3
				sg := GroupSeg{N: N, LdY: ldy, BF16: sc.bf16}
				sep := a.poisoned(M * ldy)
				if sc.bf16 {
					w := randBF16(r, N*K, 0.05)
					sg.W = a.up(w)
					refs[i] = refGemv(func(n, kk int) float64 { return bf16ToF64(w[n*K+kk]) }, xref, nil, N, K, M, ldx, ldy)
					if M >= GemvBF16TileMinM {
						chk(k.GemvBF16Tile(s, sep, xsep, sg.W, 0, N, K, M, ldx, ldy))
					} else {
						sep = 0 // no bf16 tile kernel for M rows: refs[i] alone checks it
					}
				} else {
					w := randFP8(r, N*K)
					scl := randScales(r, cdiv(N, 128)*cdiv(K, 128), -8)
					sg.W, sg.S = a.up(w), a.up(scl)
					refs[i] = refGemv(fp8At(w, scl, K), xref, nil, N, K, M, ldx, ldy)
					chk(k.GemvFP8Tile(s, sep, xsep, sg.W, sg.S, 0, N, K, M, ldx, ldy))
				}
				if sep != 0 {
					seps[i] = rowsOf(downF32(c, sep, M*ldy), M, N, ldy)
				}
				segs[i] = sg
			}
			var runs [2][][]float32
			for run := range runs {
				for i := range segs {
					segs[i].Y = a.poisoned(M * segs[i].LdY)
				}
				chk(k.GemvGroup(s, xp, K, M, ldx, segs, norm))
				for _, sg := range segs {
					runs[run] = append(runs[run], rowsOf(downF32(c, sg.Y, M*sg.LdY), M, sg.N, sg.LdY))
				}
			}
			for i, sg := range segs {
				name := fmt.Sprintf("gemv_group K=%d M=%d ldx=%d norm=%v seg %d/%d N=%d bf16=%v", K, M, ldx, gc.norm, i, len(segs), sg.N, sg.BF16) + tag
				record(t, name, relMetric, relErr(runs[0][i], rowsOf64(refs[i], M, sg.N, sg.LdY)), boundF32)
				if seps[i] != nil {
					record(t, name+" vs separate launches", "differing outputs", float64(diffCount(runs[0][i], seps[i])), 0)
				}
				record(t, name+" repeat", "differing outputs", float64(diffCount(runs[0][i], runs[1][i])), 0)
			}
		}
		// Bad calls fail with a message instead of a device fault.
		w := a.up(randFP8(r, 64*64))
		y := a.raw(4 * 64 * 8)
		xb := a.up(randF32(r, 64*8, 1))
		for _, bad := range []struct {
			K, M, ldx int
			segs      []GroupSeg
		}{
			{64, 9, 64, []GroupSeg{{W: w, S: w, Y: y, N: 64, LdY: 64}}},
			{64, 1, 64, nil},
			{64, 1, 64, []GroupSeg{{W: w, Y: y, N: 64, LdY: 64}}},                  // fp8 without scales
			{60, 1, 64, []GroupSeg{{W: w, S: w, Y: y, N: 64, LdY: 64}}},            // K % 16 != 0
			{64, 2, 64, []GroupSeg{{W: w, S: w, Y: y, N: 64, LdY: 32}}},            // LdY < N
			{64, 1, 64, []GroupSeg{{W: w, S: w, Y: xb, N: 64, LdY: 64}}},           // output over the input
			{64, 1, 64, make([]GroupSeg, MaxGroupSegs+1)},                          // too many
			{64, 1, 64, []GroupSeg{{W: w + 4, S: w, Y: y, N: 64, LdY: 64}}},        // unaligned weights
			{64, 1, 64, []GroupSeg{{W: w, S: w, Y: y, N: 0, LdY: 64, BF16: true}}}, // no rows
		} {
			if err := k.GemvGroup(s, xb, bad.K, bad.M, bad.ldx, bad.segs, GroupNorm{}); err == nil {
				t.Errorf("GemvGroup(K=%d M=%d ldx=%d, %d segments) accepted a bad call", bad.K, bad.M, bad.ldx, len(bad.segs))
			}
		}
	})
}

// rowsOf keeps the first n of each of M rows of stride ld.
func rowsOf(v []float32, M, n, ld int) []float32 {
	out := make([]float32, 0, M*n)
	for m := range M {
		out = append(out, v[m*ld:m*ld+n]...)
	}
	return out
}

func rowsOf64(v []float64, M, n, ld int) []float64 {
	out := make([]float64, 0, M*n)
	for m := range M {
		out = append(out, v[m*ld:m*ld+n]...)
	}
	return out
}

// TestGroupKernelVariants: the (rows per group, input rows) variants
// defined in the kernel source are exactly those the launcher can pick, 8
// rows per group (4 at 8 input rows) (no GPU needed).
func TestGroupKernelVariants(t *testing.T) {
	src := KernelSource()
	for _, r := range []int{2, 4, 8} {
		for _, mm := range []int{1, 2, 4, 8} {
			name := fmt.Sprintf("gemv_group_r%d_m%d(", r, mm)
			if has, want := strings.Contains(src, name), r == min(8, 32/mm); has != want {
				t.Errorf("kernel %s defined: %v, want %v", name, has, want)
			}
		}
	}
	// The launcher's shapes stay within the compiled variants.
	for _, M := range []int{1, 2, 3, 4, 5, 8} {
		for _, N := range []int{1, 64, 576, 1536, 8192, 24576} {
			for _, bf16 := range []bool{false, true} {
				G, R := groupShape(132, GroupSeg{N: N, BF16: bf16}, 7168, M)
				name := fmt.Sprintf("gemv_group_r%d_m%d(", R, tileMM(M))
				if !strings.Contains(src, name) || G < 32 || G > tileThreads || G%32 != 0 {
					t.Errorf("M=%d N=%d bf16=%v: G=%d R=%d (%s not compiled?)", M, N, bf16, G, R, name)
				}
			}
		}
	}
	// Each segment takes its separate launch's G (so its bits): at one input
	// row that includes the whole-chunks rule (DeepSeek-V3.2 dims' q_b and
	// wq_b rows of 1536 bytes on 32-thread groups), at two rows not.
	for _, c := range []struct{ N, K, M, want int }{
		{24576, 1536, 1, 32}, {8192, 1536, 1, 32}, {16384, 2048, 1, 64}, {24576, 1536, 2, 64},
	} {
		G, _ := groupShape(132, GroupSeg{N: c.N}, c.K, c.M)
		sG, _, _ := tileLaunchShape(132, c.N, c.K, c.M, 1, 1, false, false, expertLaunch{})
		if G != c.want || G != sG {
			t.Errorf("groupShape N=%d K=%d M=%d: G=%d, want %d (the separate launch's %d)", c.N, c.K, c.M, G, c.want, sG)
		}
	}
}
