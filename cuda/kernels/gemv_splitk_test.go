package kernels

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/tilert-go/tilert/cuda"
)

// TestSplitKShape: both models' o_proj shapes take the split on an H100 /
// H200's 132 SMs (the compiled 8-row, four-blocks-an-SM shape), and what
// the kernel cannot take is refused.
func TestSplitKShape(t *testing.T) {
	for _, c := range []struct {
		N, K, splits int
		ok           bool
	}{
		{7168, 16384, 8, true}, {6144, 16384, 8, true}, {1000, 4096, 4, true}, {2048, 4096, 2, true},
		{7168, 16384, 16, false}, // more slices than the combine's slots
		{7168, 16384, 1, false},
		{7168, 16000, 8, false}, // slices of 2000 columns: not whole scale blocks
		{7168, 16384, 3, false},
		{64, 1024, 2, false}, // too few rows for 8-row groups on 132 SMs
	} {
		if ok := splitKOK(132, c.N, c.K, c.splits); ok != c.ok {
			t.Errorf("splitKOK(132, %d, %d, %d) = %v, want %v", c.N, c.K, c.splits, ok, c.ok)
		}
	}
}

// TestKernelGemvSplitK: each slice's partial equals the routed down's
// launch over the slices as contiguous experts (ExpertsFP8Shaped, splits
// slots) bit for bit, and the partials' sum (MoECombineSlots, weights 1)
// the float64 reference of the whole row, on fresh inputs at both models'
// o_proj shapes and two small ones.
func TestKernelGemvSplitK(t *testing.T) {
	onGPU(t, func(c *cuda.Ctx, k *Set, a *allocs, r *rand.Rand) {
		s := c.Stream()
		for _, tc := range []struct{ N, K, splits int }{{7168, 16384, 8}, {6144, 16384, 8}, {1000, 4096, 4}, {2048, 4096, 2}} {
			N, K, splits := tc.N, tc.K, tc.splits
			name := fmt.Sprintf("gemv split-K %dx%d in %d", N, K, splits)
			if !k.SplitKOK(N, K, splits) {
				t.Errorf("%s: SplitKOK false", name)
				continue
			}
			w, sc, x := randFP8(r, N*K), randScales(r, cdiv(N, 128)*cdiv(K, 128), -7), randF32(r, K, 1)
			xp := a.up(x)
			y := a.poisoned(splits * N)
			n0 := SplitKLaunches.Load()
			chk(k.GemvFP8SplitK(s, y, xp, a.up(w), a.up(sc), N, K, splits))
			if n := SplitKLaunches.Load() - n0; n != 1 {
				t.Errorf("%s: %d split-K launches, want 1", name, n)
			}
			// The slices as contiguous experts.
			ks, kb := K/splits, K/128
			kbs := ks / 128
			ex := fp8Experts{K: ks, w: make([][]byte, splits), sc: make([][]float32, splits), wp: make([]cuda.DevPtr, splits), sp: make([]cuda.DevPtr, splits)}
			ids := make([]int32, splits)
			for j := range splits {
				ids[j] = int32(j)
				ex.w[j] = make([]byte, N*ks)
				for n := range N {
					copy(ex.w[j][n*ks:(n+1)*ks], w[n*K+j*ks:n*K+(j+1)*ks])
				}
				ex.sc[j] = make([]float32, cdiv(N, 128)*kbs)
				for nb := range cdiv(N, 128) {
					copy(ex.sc[j][nb*kbs:(nb+1)*kbs], sc[nb*kb+j*kbs:nb*kb+(j+1)*kbs])
				}
				ex.wp[j], ex.sp[j] = a.up(ex.w[j]), a.up(ex.sc[j])
			}
			y2 := a.poisoned(splits * N)
			chk(k.ExpertsFP8Shaped(s, y2, xp, ks, 1, 0, [2]cuda.DevPtr{a.up(ex.wp)}, [2]cuda.DevPtr{a.up(ex.sp)}, a.up(ids), splits,
				[2]cuda.DevPtr{}, [2]cuda.DevPtr{}, 0, N, ks, 0))
			got, want := downF32(c, y, splits*N), downF32(c, y2, splits*N)
			if d := diffCount(got, want); d != 0 {
				t.Errorf("%s: %d of %d partials differ from the routed down's launch over the slices", name, d, splits*N)
			}
			ones := make([]float32, splits)
			for j := range ones {
				ones[j] = 1
			}
			out := a.poisoned(N)
			chk(k.MoECombineSlots(s, out, y, a.up(ones), 0, 1, splits, N))
			record(t, name, relMetric, relErr(downF32(c, out, N), refGemv(fp8At(w, sc, K), x, nil, N, K, 1, K, N)), boundF32)
		}
	})
}
