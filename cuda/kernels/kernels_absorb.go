package kernels

import (
	"embed"
	"fmt"
	"sync/atomic"

	"github.com/cockroachdb/errors"

	"github.com/tilert-go/tilert/cuda"
)

// The absorb module (TILERT_GPU_ABSORB_FAST=1; helper absorb, issue 10):
// absorb_q_fast / absorb_v_fast (cu/absorb/absorb_fast.cu), the one-row
// forms of absorb_q_fp8 / absorb_v_fp8 with the same sums, compiled after
// common.cuh with the main module's flags for the device's own arch and
// loaded on first use, so the main module's source (its kernel cache entry
// and PTX) stays main's.

//go:embed cu/absorb/*.cu
var absorbFS embed.FS

// AbsorbKernelSource is the absorb module's source: common.cuh,
// gemv_tile.cuh (the tile GEMV's loads and one-row sums, for qb_absorb's
// q_b rows) and mla_absorb.cuh (the absorb products' loads and sums), the
// default module's texts, then every cu/absorb/*.cu in name order, each
// marked with #line.
func AbsorbKernelSource() string {
	return moduleSource(absorbFS, "cu/absorb/*.cu", gemvTileHeader, mlaAbsorbHeader)
}

// CompileAbsorb compiles the absorb module for a device of compute
// capability major.minor through the cache (no GPU needed).
func CompileAbsorb(nv *cuda.NVRTC, major, minor int, cache cuda.KernelCache) (*cuda.Compiled, error) {
	return cuda.CompileModule(nv, major, minor, AbsorbKernelSource(), "tilert_kernels_absorb.cu", kernelOptions, cache)
}

// absorbModule: fp8x4_to_f32 takes the sm_89+ conversions; the engine's
// fp8 absorbs run on the H200.
var absorbModule = &extraModule{
	name: "tilert_kernels_absorb",
	need: func(i cuda.DeviceInfo) error {
		if i.CCMajor < 9 {
			return errors.Newf("the one-row absorb kernels need sm_90; this device is %d.%d", i.CCMajor, i.CCMinor)
		}
		return nil
	},
	compile: func(nv *cuda.NVRTC, i cuda.DeviceInfo) (*cuda.Compiled, error) {
		return CompileAbsorb(nv, i.CCMajor, i.CCMinor, cuda.DefaultKernelCache())
	},
}

// absorbMod loads the absorb module in k's context on first use (a failure
// is kept).
func (k *Set) absorbMod() (*cuda.Module, error) { return absorbModule.load(k) }

// AbsorbFastSupported says whether the absorb module loads here, and if not
// why (the engine's runners ask before any graph capture).
func (k *Set) AbsorbFastSupported() error {
	_, err := k.absorbMod()
	return err
}

// AbsorbFastLaunches counts launches of the one-row absorb kernels (the
// engine checks ask that they ran).
var AbsorbFastLaunches atomic.Int64

// absorbQFastKernel names the one-row absorb_q kernel for 16*g columns a
// block and nope rows (the fewest rows a thread that cover nope: 4, else
// 8), or "" where none takes the shape (g in 2, 4, 8; nope <= 256, as
// AbsorbQFastOK asks). Up to 256 rows g 2 and 4 always take 4 rows a
// thread, so only g 8 has an 8-row kernel (g2_r8 and g4_r8 were never
// launched and were removed in session 54).
func absorbQFastKernel(g, nope int) string {
	if (g != 2 && g != 4 && g != 8) || nope > 256 {
		return ""
	}
	nr := 4
	if nope > nr*256/g {
		nr = 8
	}
	return fmt.Sprintf("absorb_q_fast_g%d_r%d", g, nr)
}

// absorbVFastKernel names the one-row absorb_v kernel for rw rows a warp
// (1, 2, 4 or 8), "" otherwise.
func absorbVFastKernel(rw int) string {
	switch rw {
	case 1, 2, 4, 8:
		return fmt.Sprintf("absorb_v_fast_rw%d", rw)
	}
	return ""
}

// AbsorbQFastOK says whether AbsorbQFast takes one row of this shape (the
// same conditions as AbsorbQFP8 plus P/2 <= 256).
func AbsorbQFastOK(nope, R, hs, P int, qpe bool) bool {
	if nope <= 0 || nope > 256 || R <= 0 || R%32 != 0 || hs < nope {
		return false
	}
	return !qpe || (P > 0 && P%2 == 0 && P <= 512 && hs >= nope+P)
}

// AbsorbQFast is AbsorbQFP8 for ONE query row (rows ldq apart do not
// matter), launched as absorb_q_fast with AbsorbQFP8's columns a block
// (absorbCols): the same outputs bit for bit.
func (k *Set) AbsorbQFast(s cuda.Stream, out, qpe, q, w, scale cuda.DevPtr, H, nope, R, hs, P int, rope QRope) error {
	return k.absorbQFast(s, out, qpe, q, w, scale, H, nope, R, hs, P, rope, QScale{}, absorbCols(k.c.Info().SMs, H, R))
}

// QScale is RMSNorm's scale that absorb_q applies to its outputs when q_b
// ran on q_a times the norm's weight alone (TILERT_GPU_QA_NORM=late):
// r = rsqrt(sum(SumSq[0..N)) / K + Eps), SumSq the layer-input group's
// per-block sums of q_a's squares (GroupSeg.SumSq), K q_a's width. The zero
// value scales nothing.
type QScale struct {
	SumSq cuda.DevPtr
	N, K  int
	Eps   float32
}

// On says whether qs scales anything.
func (qs QScale) On() bool { return qs.SumSq != 0 }

// AbsorbQFastScaled is AbsorbQFast with every output (the absorbed sums and
// the rotated RoPE part) times qs's r, on the absorb_q_fast_..._n kernels:
// the default kernel's values times r, bit for bit, where r is taken as
// rsqrtf(warp sum / K + Eps) of the partials (lane i adding SumSq[i],
// SumSq[i+32], ... from 0.0f, then the butterfly).
func (k *Set) AbsorbQFastScaled(s cuda.Stream, out, qpe, q, w, scale cuda.DevPtr, H, nope, R, hs, P int, rope QRope, qs QScale) error {
	if !qs.On() || qs.N <= 0 || qs.K <= 0 {
		return errors.Newf("absorb q fast scaled: SumSq=%#x N=%d K=%d: needs the sums, N > 0 and K > 0", uint64(qs.SumSq), qs.N, qs.K)
	}
	return k.absorbQFast(s, out, qpe, q, w, scale, H, nope, R, hs, P, rope, qs, absorbCols(k.c.Info().SMs, H, R))
}

// AbsorbQScaledLaunches counts launches of the _n kernels (tests).
var AbsorbQScaledLaunches atomic.Int64

// absorbQFast launches absorb_q_fast with 16*g columns a block (g other
// than absorbCols' changes the sums' order: the timing sweep's knob).
func (k *Set) absorbQFast(s cuda.Stream, out, qpe, q, w, scale cuda.DevPtr, H, nope, R, hs, P int, rope QRope, qs QScale, g int) error {
	name := absorbQFastKernel(g, nope)
	if H <= 0 || !AbsorbQFastOK(nope, R, hs, P, qpe != 0) || name == "" || R%(16*g) != 0 {
		return errors.Newf("absorb q fast: H=%d nope=%d R=%d hs=%d P=%d with %d columns a block", H, nope, R, hs, P, 16*g)
	}
	args := []any{out, qpe, q, w, scale, H, nope, R, hs, P, rope.Pos, rope.Cos, rope.Sin, b2i(rope.Interleaved)}
	if qs.On() {
		name += "_n"
		args = append(args, qs.SumSq, qs.N, qs.K, qs.Eps)
	}
	mod, err := k.absorbMod()
	if err != nil {
		return errors.Wrap(err, "absorb q fast: the absorb module")
	}
	f, err := k.c.Function(mod, name)
	if err != nil {
		return err
	}
	if err := k.launchFn(f, cuda.D1(H*(R/(16*g))), cuda.D1(256), 0, s, args...); err != nil {
		return err
	}
	AbsorbFastLaunches.Add(1)
	if qs.On() {
		AbsorbQScaledLaunches.Add(1)
	}
	return nil
}

// AbsorbVFast is AbsorbVFP8 for ONE row written at out (R = 512), with rw
// rows a warp (1, 2, 4 or 8; 0: absorbFastRows). Every rw gives the same
// bits.
func (k *Set) AbsorbVFast(s cuda.Stream, out, x, w, scale cuda.DevPtr, H, vd, R, rw int) error {
	if rw == 0 {
		rw = absorbFastRows(k.c.Info().SMs, H, vd)
	}
	return k.absorbVFast(s, out, x, w, scale, H, vd, R, rw)
}

// absorbFastRows is absorbRows (4 or 2 rows a warp while that still gives
// every SM a block) except where absorbRows falls back to 1: there 2 rows a
// warp while at least half the SMs get a block. Measured on the H200
// (session 10 call B, graph-timed, one row): 16 heads (the TP-8 shard) rw
// 1 / 2 / 4 / 8 = 2.63 / 2.23 / 2.23 / 2.60 us; 128 heads 8.28 / 4.88 /
// 4.30 / 4.31 us.
func absorbFastRows(sms, H, vd int) int {
	if rw := absorbRows(sms, H, vd); rw > 1 {
		return rw
	}
	if 2*H*cdiv(vd, 16) >= sms {
		return 2
	}
	return 1
}

// absorbVFast launches absorb_v_fast with rw rows a warp.
func (k *Set) absorbVFast(s cuda.Stream, out, x, w, scale cuda.DevPtr, H, vd, R, rw int) error {
	name := absorbVFastKernel(rw)
	if H <= 0 || vd <= 0 || R != MLALatentDim || name == "" {
		return errors.Newf("absorb v fast: H=%d vd=%d R=%d (must be %d) rows a warp %d", H, vd, R, MLALatentDim, rw)
	}
	mod, err := k.absorbMod()
	if err != nil {
		return errors.Wrap(err, "absorb v fast: the absorb module")
	}
	f, err := k.c.Function(mod, name)
	if err != nil {
		return err
	}
	if err := k.launchFn(f, cuda.D1(H*cdiv(vd, 8*rw)), cuda.D1(256), 0, s, out, x, w, scale, H, vd); err != nil {
		return err
	}
	AbsorbFastLaunches.Add(1)
	return nil
}
