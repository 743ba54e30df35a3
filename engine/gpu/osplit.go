package gpu

import (
	"encoding/binary"
	"math"
	"os"

	"github.com/cockroachdb/errors"

	"github.com/tilert-go/tilert/cuda"
	"github.com/tilert-go/tilert/cuda/kernels"
	"github.com/tilert-go/tilert/numeric"
)

// TILERT_GPU_OPROJ_SPLIT=1: a one-row step's o_proj as split-K slices
// (kernels.GemvFP8SplitK, gemv_tile_fp8_r8_m1_o4k) summed by the
// post-attention add + RMSNorm's launch (moeCombineNorm with weights 1), in
// place of one GEMV and addRMSNorm. o_proj's one-row launch is one wave of
// 512 KiB blocks that puts 64 of DeepSeek-V3.2 dims' 7168 rows on some SMs
// against a mean of 54 (cuda/kernels/NOTES.md "o_proj's tail"; session 56's
// H200 trace: 34.0 us against 27.8 of bytes), while the routed down, the
// same bytes as 8 slots of 7168 x 2048, streams near the copy rate on small
// blocks dealt out as SMs free up. The slices run on that shape. The sum
// order changes (each slice, then the slices in order): the outputs are
// o_proj's up to float32 rounding. Unset or 0: one GEMV. Measured on one
// H100 (session 59 call A): +42..+53 us a step on both models and contexts,
// the split streaming no faster than `_d16` there; not yet on an H200.
var oSplitMode = os.Getenv("TILERT_GPU_OPROJ_SPLIT")

// oSplitOn says whether TILERT_GPU_OPROJ_SPLIT asks for the split (opt-in:
// slower on an H100, not measured on an H200).
func oSplitOn() bool { return oSplitMode == "1" }

// oSplitSlices is the slices block cuts this layer's o_proj into (0: one
// GEMV): one row, fp8 weights, the most of 8, 4, 2 the device takes.
func (f *fwd) oSplitSlices(lw *dlayer) int {
	l := lw.O
	if f.M != 1 || f.e.ws.osk == 0 || l.kind != linFP8 || !oSplitOn() {
		return 0
	}
	for _, s := range []int{8, 4, 2} {
		if f.o.b.splitKOK(l.out, l.in, s) {
			return s
		}
	}
	return 0
}

// splitOnes is the combine's weights for the slices: kernels.SplitKMax
// float32 ones.
func splitOnes() []byte {
	b := make([]byte, 4*kernels.SplitKMax)
	for i := range kernels.SplitKMax {
		binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(1))
	}
	return b
}

func (b *cudaDevice) splitKOK(N, K, splits int) bool { return gemvTileOn && b.k.SplitKOK(N, K, splits) }

func (b *cudaDevice) gemvSplitK(y, x, w, scale cuda.DevPtr, N, K, splits int) error {
	return b.k.GemvFP8SplitK(b.s, y, x, w, scale, N, K, splits)
}

// splitKOK: the emulator takes slices of whole 16-byte chunks (the GPU
// whole 128-column scale blocks), so the tiny presets' o_proj (128 and 192
// columns) runs the engine's split path in the CPU tests.
func (m *emuDevice) splitKOK(N, K, splits int) bool {
	return N > 0 && K > 0 && splits >= 2 && splits <= kernels.SplitKMax && K%splits == 0 && (K/splits)%16 == 0
}

// gemvSplitK writes each slice's partial as gemvFP8 of that slice's columns.
func (m *emuDevice) gemvSplitK(y, x, w, scale cuda.DevPtr, N, K, splits int) error {
	if !m.splitKOK(N, K, splits) {
		return errors.Newf("emu gemv split-K: %d rows of %d in %d slices", N, K, splits)
	}
	ks, kb := K/splits, (K+127)/128
	wb := m.mem(w, N*K)
	sb := m.f32(scale, ((N+127)/128)*kb)
	for j := range splits {
		err := m.gemv(fptr(y, j*N), fptr(x, j*ks), N, ks, 1, ks, N, func(n int, dst []float32) {
			row, sc := wb[n*K:(n+1)*K], sb[(n/128)*kb:(n/128+1)*kb]
			for k := range dst {
				c := j*ks + k
				dst[k] = numeric.FP8E4M3ToFloat32(row[c]) * sc[c/numeric.FP8BlockSize]
			}
		})
		if err != nil {
			return err
		}
	}
	return nil
}

func (gb *graphDevice) gemvSplitK(y, x, w, scale cuda.DevPtr, N, K, splits int) error {
	return gb.rec("gemvSplitK", int64(N)*int64(K), func(b device) error { return b.gemvSplitK(y, x, w, scale, N, K, splits) },
		ku(y), ku(x), ku(w), ku(scale), ki(N), ki(K), ki(splits))
}
