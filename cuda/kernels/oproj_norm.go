package kernels

import (
	"sync/atomic"

	"github.com/cockroachdb/errors"

	"github.com/tilert-go/tilert/cuda"
)

// GemvAddNorm is one row's fp8 tile GEMV (o_proj) with AddRMSNorm of its
// output into the residual in the same launch (cu/oproj_norm.cu): Y = W X
// on the plan the plain launch (GemvFP8Tile) takes, so Y's bits; the block
// that finishes the last tile then runs add_rmsnorm_reg's row (Res += Y,
// H = NormW * (Res * r)) with its threads played in order, so Res's and H's
// bits. Every output is GemvFP8Tile + AddRMSNorm's.
type GemvAddNorm struct {
	W, S cuda.DevPtr // fp8 [N][K] rows, their [N/128][K/128] block scales
	X    cuda.DevPtr // the input row, K float32
	Y    cuda.DevPtr // the GEMV's output, N float32 (AddRMSNorm's b)
	N, K int
	Res  cuda.DevPtr // the residual row, N float32, updated in place (AddRMSNorm's x)
	Norm cuda.DevPtr // the norm's weights, N float32
	H    cuda.DevPtr // the normed row, N float32 (AddRMSNorm's y)
	Eps  float32
	// Cnt: one int32, zeroed before the first launch; every launch leaves
	// it zeroed (graph replays need no reset).
	Cnt cuda.DevPtr
}

// gemvAddNormLaunches counts GemvAddNorm's fused launches (tests).
var gemvAddNormLaunches atomic.Int64

// GemvAddNormLaunches is how many fused o_proj launches this process made.
func GemvAddNormLaunches() int64 { return gemvAddNormLaunches.Load() }

// gemvAddNormKernels are the plain one-row plans with a fused twin
// (name + "_an").
var gemvAddNormKernels = setOf(
	"gemv_tile_fp8_r8_m1", "gemv_tile_fp8_r8_m1_d16", "gemv_tile_fp8_r8_m1_o4", "gemv_tile_fp8_r8_m1_d16s",
	"gemv_tile_fp8_r4_m1", "gemv_tile_fp8_r4_m1_d16", "gemv_tile_fp8_r4_m1_o4", "gemv_tile_fp8_r4_m1_d16s",
	"gemv_tile_fp8_r2_m1", "gemv_tile_fp8_r2_m1_d16", "gemv_tile_fp8_r1_m1",
)

// Check says what is wrong with a's shapes, or nil.
func (a *GemvAddNorm) Check() error {
	switch {
	case a.N <= 0 || a.K <= 0 || a.K%16 != 0:
		return errors.Newf("gemv + add-norm: N=%d K=%d: K must be a positive multiple of 16", a.N, a.K)
	case !normRegsFit(a.N):
		return errors.WithHint(errors.Newf("gemv + add-norm: a row of %d values is not add_rmsnorm_reg's (at most %d a thread of %d)",
			a.N, normRegs, normThreads(a.N)), "run GemvFP8Tile then AddRMSNorm")
	case a.W == 0 || uint64(a.W)%16 != 0 || a.S == 0 || !TileOK(a.X, a.K, a.K, 1) || a.Y == 0:
		return errors.Newf("gemv + add-norm: weights %#x (16-byte aligned), scales %#x, x %#x (tile-aligned) and y %#x are needed",
			uint64(a.W), uint64(a.S), uint64(a.X), uint64(a.Y))
	case a.Res == 0 || a.Norm == 0 || a.H == 0:
		return errors.Newf("gemv + add-norm: residual %#x, norm weights %#x and output %#x are needed",
			uint64(a.Res), uint64(a.Norm), uint64(a.H))
	case a.Cnt == 0:
		return errors.WithHint(errors.New("gemv + add-norm: no tile counter"),
			"give one int32 of zeroed device memory (each launch leaves it zeroed)")
	}
	return nil
}

// GemvAddNormKernel is the fused kernel an N x K one-row launch would run
// (the plain launch's plan), its group size and grid; "" where the plan has
// no fused twin (_d16s below 4 rows a group, which the plans refuse
// anyway). The kernel counts its own tiles (the tile bodies pass it them).
func (k *Set) GemvAddNormKernel(N, K int, x, w cuda.DevPtr) (name string, G, gx int) {
	plain, G, _, gx := k.tileKernel(tileLaunch{w0: w, dense: 1, x: x, ldx: K, ldy: N, N: N, K: K, M: 1})
	if !gemvAddNormKernels[plain] {
		return "", 0, 0
	}
	return plain + "_an", G, gx
}

// GemvAddNorm launches the fused GEMV + add-norm.
func (k *Set) GemvAddNorm(s cuda.Stream, a GemvAddNorm) error {
	if err := a.Check(); err != nil {
		return err
	}
	name, G, gx := k.GemvAddNormKernel(a.N, a.K, a.X, a.W)
	if name == "" {
		return errors.WithHint(errors.Newf("gemv + add-norm: the %dx%d launch's plan has no fused kernel", a.N, a.K),
			"check GemvAddNormKernel first and run GemvFP8Tile then AddRMSNorm where it gives none")
	}
	if err := k.launch(name, cuda.D1(gx), cuda.D1(tileThreads), 0, s,
		a.W, a.S, a.X, a.Y, a.N, a.K, G, b2i(TileRule >= 2), a.Res, a.Norm, a.H, normThreads(a.N), a.Eps, a.Cnt); err != nil {
		return err
	}
	gemvAddNormLaunches.Add(1)
	return nil
}
