package kernels

import (
	"sync/atomic"

	"github.com/cockroachdb/errors"

	"github.com/tilert-go/tilert/cuda"
)

// Split-K one-row GEMV (gemv_tile_fp8_r8_m1_o4k: gemv_tile.cu's body with
// SK set). A single row's o_proj (7168 or 6144 rows of 16384 fp8) runs as
// one wave of 512 KiB row blocks that puts 64 rows on some SMs against a
// mean of 54 (NOTES "o_proj's tail"), while the routed down, the same bytes
// as 8 slots of 2048 columns, deals 64 KiB blocks out as SMs free up and
// streams near the copy rate. Here the long rows are cut into slices of
// K/splits columns run as the down's slots on its shape; slice j's partial
// sums land in row j of y, and MoECombineNorm (weights 1) adds them in slice
// order, so the GEMV's sum order is the slices' and then theirs.

// SplitKMax is the most slices GemvFP8SplitK cuts a row into: the partials
// are summed as slots by MoECombineNorm / MoECombineSlots.
const SplitKMax = moeNormKMax

// SplitKLaunches counts GemvFP8SplitK's launches (tests check the engine
// took it).
var SplitKLaunches atomic.Int64

// splitKShape is the launch shape of N rows of K fp8 columns cut into
// splits slices: the routed down's one-row shape over splits slots.
func splitKShape(sms, N, K, splits int) (G, R int, v string) {
	return tileLaunchShape(sms, N, K/splits, 1, 1, splits, false, true, expertLaunch{slots: splits})
}

// SplitKOK says whether GemvFP8SplitK takes N rows of K columns in splits
// slices here: 2..SplitKMax slices of whole 128-column scale blocks, on the
// compiled shape (8 rows a group, four blocks an SM).
func (k *Set) SplitKOK(N, K, splits int) bool { return splitKOK(k.c.Info().SMs, N, K, splits) }

// SplitKSlicesOK says whether rows of K columns cut into splits slices
// (2..SplitKMax of whole 128-column scale blocks), whatever the device.
func SplitKSlicesOK(K, splits int) bool {
	return splits >= 2 && splits <= SplitKMax && K > 0 && K%splits == 0 && (K/splits)%128 == 0
}

func splitKOK(sms, N, K, splits int) bool {
	if N <= 0 || !SplitKSlicesOK(K, splits) {
		return false
	}
	_, R, v := splitKShape(sms, N, K, splits)
	return R == 8 && v == "_o4"
}

// GemvFP8SplitK writes slice j's partial of one input row x through fp8
// weights w [N][K] with 128 x 128 block scales: y[j][n] = sum over k in
// [j K/splits, (j+1) K/splits) of w[n][k] scale x[k], for j < splits. The
// slices' sum is GemvFP8's result up to float32 summation order; each
// slice's bits are the routed down's for that slice as a contiguous
// N x K/splits expert (ExpertsFP8Shaped over splits slots).
func (k *Set) GemvFP8SplitK(s cuda.Stream, y, x, w, scale cuda.DevPtr, N, K, splits int) error {
	if !k.SplitKOK(N, K, splits) {
		return errors.WithHint(errors.Newf("gemv split-K: %d rows of %d columns in %d slices", N, K, splits),
			"the slices must be 2..8 whole 128-column scale blocks on the 8-row, four-blocks-an-SM shape (SplitKOK); run GemvFP8Tile otherwise")
	}
	if w == 0 || x == 0 || y == 0 || uint64(w)%16 != 0 || uint64(x)%16 != 0 {
		return errors.WithHint(errors.Newf("gemv split-K: w %#x, x %#x, y %#x", uint64(w), uint64(x), uint64(y)),
			"the weights and the input row must be set and 16-byte aligned")
	}
	sms := k.c.Info().SMs
	ks := K / splits
	G, R, _ := splitKShape(sms, N, K, splits)
	gx := tileGridX(cdiv(cdiv(N, R), tileThreads/G), k.tileCap(), sms, splits)
	SplitKLaunches.Add(1)
	var z cuda.DevPtr
	return k.launch("gemv_tile_fp8_r8_m1_o4k", cuda.D3(gx, splits, 1), cuda.D1(tileThreads), 0, s, z, z, z, z, z, 0,
		w, scale, z, z, x, ks, 1, 0, y, N, z, N, K, 1, G, b2i(TileRule >= 2))
}
