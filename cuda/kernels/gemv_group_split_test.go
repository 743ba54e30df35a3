package kernels

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/tilert-go/tilert/cuda"
)

// TestKernelGemvGroupSplit: the split grouped GEMV (GemvGroupSplit) writes
// exactly gemv_group's bits (GemvGroup on the same inputs) at the layer
// inputs of DeepSeek-V3.2 and GLM-5 and odd shapes, under both tile rules
// (their group sizes differ), with rows per group pinned and more shared
// memory (R = 8, the dynamic-shared attribute); rows M = 2..4 and normed
// launches run GemvGroup itself (reported as not split).
func TestKernelGemvGroupSplit(t *testing.T) {
	defer func(r, sm, sr int) { TileRule, forceSplitSmem, forceSplitR = r, sm, sr }(TileRule, forceSplitSmem, forceSplitR)
	onGPU(t, func(c *cuda.Ctx, k *Set, a *allocs, r *rand.Rand) {
		s := c.Stream()
		cases := []groupCase{
			// DeepSeek-V3.2: q_a, kv_a, indexer wk, weights_proj (bf16).
			{K: 7168, M: 1, segs: []groupSegCase{{1536, false}, {576, false}, {128, false}, {64, true}}},
			// GLM-5: hidden 6144, q_lora 2048, kv 512+64, wk 128, 64 heads.
			{K: 6144, M: 1, segs: []groupSegCase{{2048, false}, {576, false}, {128, false}, {64, true}}},
			{K: 6144, M: 1, segs: []groupSegCase{{2048, false}, {576, false}, {128, false}, {64, false}}},
			{K: 512, M: 1, segs: []groupSegCase{{1, false}}},
			{K: 512, M: 1, segs: []groupSegCase{{1, true}}},
			{K: 2048, M: 1, pad: 4, segs: []groupSegCase{{301, false}, {77, true}, {130, false}}},
			{K: 1024, M: 1, segs: []groupSegCase{{200, true}, {129, false}, {9, false}, {33, true}}},
			{K: 7168 + 16, M: 1, segs: []groupSegCase{{3, false}, {131, false}}},
			// Not split: more rows, or a norm (GemvGroup runs).
			{K: 7168, M: 2, segs: []groupSegCase{{1536, false}, {576, false}, {128, false}, {64, true}}},
			{K: 2048, M: 3, pad: 4, segs: []groupSegCase{{301, false}, {77, true}, {130, false}}},
			{K: 6144, M: 4, segs: []groupSegCase{{2048, false}, {576, false}, {128, false}, {64, true}}},
			{K: 7168, M: 1, norm: true, segs: []groupSegCase{{300, false}, {64, true}}},
		}
		type variant struct {
			rule, smem, r int
		}
		for _, v := range []variant{{3, 0, 0}, {1, 0, 0}, {3, 0, 1}, {3, 0, 2}, {3, 64 << 10, 8}, {1, 64 << 10, 8}} {
			TileRule, forceSplitSmem, forceSplitR = v.rule, v.smem, v.r
			for _, gc := range cases {
				K, M := gc.K, gc.M
				ldx := K + gc.pad
				xp := a.up(randF32(r, M*ldx, 1))
				var norm GroupNorm
				if gc.norm {
					norm = GroupNorm{W: a.up(randF32(r, K, 1)), Eps: 1e-6}
				}
				segs := make([]GroupSeg, len(gc.segs))
				for i, sc := range gc.segs {
					sg := GroupSeg{N: sc.N, LdY: sc.N + 3, BF16: sc.bf16}
					if sc.bf16 {
						sg.W = a.up(randBF16(r, sc.N*K, 0.05))
					} else {
						sg.W = a.up(randFP8(r, sc.N*K))
						sg.S = a.up(randScales(r, cdiv(sc.N, 128)*cdiv(K, 128), -8))
					}
					segs[i] = sg
				}
				out := func(split bool) ([][]float32, bool) {
					for i := range segs {
						segs[i].Y = a.poisoned(M * segs[i].LdY)
					}
					ran := false
					if split {
						var err error
						ran, err = k.GemvGroupSplit(s, xp, K, M, ldx, segs, norm)
						chk(err)
					} else {
						chk(k.GemvGroup(s, xp, K, M, ldx, segs, norm))
					}
					var ys [][]float32
					for _, sg := range segs {
						ys = append(ys, rowsOf(downF32(c, sg.Y, M*sg.LdY), M, sg.N, sg.LdY))
					}
					return ys, ran
				}
				want, _ := out(false)
				got, ran := out(true)
				again, _ := out(true)
				wantRan := M == 1 && !gc.norm
				tag := fmt.Sprintf(" rule=%d smem=%d R=%d", v.rule, v.smem, v.r)
				if ran != wantRan {
					t.Errorf("split K=%d M=%d norm=%v%s: split kernel ran=%v, want %v", K, M, gc.norm, tag, ran, wantRan)
				}
				for i, sg := range segs {
					name := fmt.Sprintf("gemv_group_split K=%d M=%d ldx=%d norm=%v seg %d/%d N=%d bf16=%v split=%v", K, M, ldx, gc.norm, i, len(segs), sg.N, sg.BF16, ran) + tag
					record(t, name+" vs gemv_group", "differing outputs", float64(diffCount(got[i], want[i])), 0)
					record(t, name+" repeat", "differing outputs", float64(diffCount(got[i], again[i])), 0)
				}
			}
		}
		// Bad calls fail with a message instead of a device fault.
		w := a.up(randFP8(r, 64*512))
		x := a.up(randF32(r, 512, 1))
		for _, segs := range [][]GroupSeg{
			{{W: w, Y: a.raw(4 * 64), N: 64, LdY: 64}},                               // fp8 without scales
			{{W: w, S: a.up(randScales(r, 4, -8)), Y: x, N: 64, LdY: 64}},            // output over the input
			{{W: w, S: a.up(randScales(r, 4, -8)), Y: a.raw(4 * 64), N: 0, LdY: 64}}, // no rows
			{{W: w, S: a.up(randScales(r, 4, -8)), Y: a.raw(4 * 64), N: 64, LdY: 64, BF16: false}, {}},
		} {
			if _, err := k.GemvGroupSplit(s, x, 512, 1, 512, segs, GroupNorm{}); err == nil {
				t.Errorf("GemvGroupSplit accepted bad segments %+v", segs)
			}
		}
	})
}
