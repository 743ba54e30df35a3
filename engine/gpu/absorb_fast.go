package gpu

import (
	"log/slog"
	"os"
	"sync"

	"github.com/tilert-go/tilert/cuda/kernels"
)

// absorbFastOn (TILERT_GPU_ABSORB_FAST; on by default since session 10,
// =0 goes back; helper absorb, issue 10): the one-row absorb products of a
// decode step (absorbQ with q's RoPE part, absorbV) over fp8 W_UK / W_UV
// run on absorb_q_fast / absorb_v_fast (cuda/kernels/cu/absorb/
// absorb_fast.cu, a module of its own loaded before any graph capture):
// absorb_q_fp8 / absorb_v_fp8's block shapes and sums with a shorter
// latency chain, so every output is the default kernels' bit for bit and
// the emulator (emu.go), the goldens and every tolerance stand unchanged.
// Applies to one query row (a 1-slot step without MTP, and the TP-8
// shard's 16 heads); several rows, float32 weights (exact mode), prefill
// and TILERT_GPU_ABSORB_WIDE=0 keep their kernels. Measured on the H200
// (session 10 call B): 128 heads absorbQ 7.84 -> 6.38 us, absorbV 5.68 ->
// 4.25 us graph-timed; the 9-layer step at 8192 2.927 -> 2.904 ms.
var absorbFastOn = os.Getenv("TILERT_GPU_ABSORB_FAST") != "0"

// absorbFastRW: absorb_v_fast's rows a warp (TILERT_GPU_ABSORB_FAST_RW =
// 1, 2, 4 or 8; unset or anything else: kernels' absorbFastRows, 4 at
// 128 heads, 2 at 16). Every choice gives the same bits: a knob for a
// device sweep of the step (2 keeps all 1024 blocks of 128 heads resident).
var absorbFastRW = absorbRW(os.Getenv("TILERT_GPU_ABSORB_FAST_RW"))

func absorbRW(v string) int {
	switch v {
	case "1", "2", "4", "8":
		return int(v[0] - '0')
	}
	return 0
}

var absorbFastOnce sync.Once

// absorbFastReady says whether the absorb module (kernels.
// AbsorbFastSupported) loads here; with the switch on, the runners call it
// before any capture. Where it does not, the default kernels run (the same
// bits), said once in the log.
func (b *cudaDevice) absorbFastReady() bool {
	err := b.k.AbsorbFastSupported()
	absorbFastOnce.Do(func() {
		if err != nil {
			slog.Warn("TILERT_GPU_ABSORB_FAST: the absorb module does not load; the default absorb kernels run (=0 silences this)", "err", err)
			return
		}
		slog.Info("TILERT_GPU_ABSORB_FAST: one-row absorb products on absorb_q_fast / absorb_v_fast")
	})
	return err == nil
}

// absorbFastQ says whether a decode absorbQ of M rows over fp8 weights
// takes absorb_q_fast (after absorbMany said no).
func (b *cudaDevice) absorbFastQ(fp8 bool, M, nope, R, hs, P int, qpe bool) bool {
	return absorbFastOn && fp8 && absorbWideOn && M == 1 && kernels.AbsorbQFastOK(nope, R, hs, P, qpe) && b.absorbFastReady()
}

// absorbFastV: the same for absorbV (R = 512).
func (b *cudaDevice) absorbFastV(fp8 bool, M, R int) bool {
	return absorbFastOn && fp8 && absorbWideOn && M == 1 && R == kernels.MLALatentDim && b.absorbFastReady()
}
