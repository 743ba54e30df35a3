package kernels

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/tilert-go/tilert/cuda"
)

// TestKernelGemvWide checks the wide fp8 and bf16 GEMVs against the float64
// reference on fresh random inputs, for every rows-per-block variant (0:
// the launcher's choice by shape), including shapes that fall back to
// the warp-per-row kernels (K not whole 16-byte chunks), a padded x (ldx > K), and that two runs agree bit
// for bit (the fixed-order combine).
func TestKernelGemvWide(t *testing.T) {
	for _, rows := range []int{0, 1, 2, 4, 8} {
		t.Run(fmt.Sprintf("rows_per_block=%d", rows), func(t *testing.T) {
			forceGemvWideRows = rows
			defer func() { forceGemvWideRows = 0 }()
			testGemvWide(t, fmt.Sprintf(" R=%d", rows))
		})
	}
}

func testGemvWide(t *testing.T, tag string) {
	onGPU(t, func(c *cuda.Ctx, k *Set, a *allocs, r *rand.Rand) {
		cases := []gemvCase{
			{576, 7168, 1, 0, false}, {256, 7168, 4, 0, true}, {130, 2112, 3, 0, false},
			{1536, 1536, 2, 0, true}, {37, 400, 1, 16, false}, {9, 16, 4, 0, true},
			{300, 2048, 1, 0, true}, {129, 16384, 2, 0, false},
			{50, 100, 2, 0, true}, // K % 16 != 0: falls back to gemv_fp8
		}
		for _, cs := range cases {
			checkGemvFP8(t, c, a, r, k.GemvFP8Wide, cs, "gemv_fp8_wide "+cs.dims()+tag, true)
		}
		for _, cs := range []gemvCase{{256, 7168, 1, 0, false}, {64, 7168, 4, 8, true}, {129, 200, 2, 0, true}, {50, 37, 2, 0, false}} {
			checkGemvBF16(t, c, a, r, k.GemvBF16Wide, cs, "gemv_bf16_wide "+cs.dims()+tag)
		}
		// Routed experts through device pointer tables.
		for _, ec := range []struct {
			E, slots, N, K int
			shared         bool
		}{{6, 4, 200, 384, true}, {6, 4, 200, 384, false}, {16, 8, 256, 7168, true}, {9, 3, 130, 2048, false}, {4, 2, 64, 100, true}} {
			E, slots, N, K := ec.E, ec.slots, ec.N, ec.K
			ex := randFP8Experts(r, a, E, N, K)
			ids := make([]int32, slots)
			for j := range ids {
				ids[j] = int32(r.IntN(E))
			}
			ids[slots-1] = ids[0] // a repeated expert
			xstride := K
			if ec.shared {
				xstride = 0
			}
			x := randF32(r, slots*K, 1)
			checkGemvExperts(t, c, a, k.GemvFP8ExpertsWide, ex, ids, x, xstride, N,
				fmt.Sprintf("gemv_fp8_experts_wide slots=%d N=%d K=%d shared_x=%v", slots, N, K, ec.shared)+tag)
		}
	})
}

// TestGemvWideRows pins the launcher's rows-per-block choice for the
// decode shapes (132 SMs): long K takes fewer rows per block, small N fewer
// so that the grid still fills the device.
func TestGemvWideRows(t *testing.T) {
	cases := []struct{ N, K, slots, want int }{
		{256, 7168, 1, 1}, {1536, 7168, 1, 2}, {7168, 2048, 1, 8}, {7168, 16384, 1, 1},
		{256, 7168, 8, 2}, {2048, 7168, 8, 2}, {24576, 1536, 1, 8}, {576, 7168, 1, 1},
	}
	for _, cs := range cases {
		got := gemvWideRowsFor(132, cs.N, cs.K, cs.slots)
		if got != cs.want {
			t.Errorf("N=%d K=%d slots=%d: rows %d, want %d", cs.N, cs.K, cs.slots, got, cs.want)
		}
		if !slices.Contains([]int{1, 2, 4, 8}, got) {
			t.Errorf("rows %d is not a compiled variant", got)
		}
	}
}
