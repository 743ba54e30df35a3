package kernels

import (
	"github.com/cockroachdb/errors"

	"github.com/tilert-go/tilert/cuda"
)

// The one-part absorbed-MLA products (gemm_p1_absorb.cu, serving-mode
// prefill with TILERT_GPU_GEMM_SPLITS=1): AbsorbQTC / AbsorbVTC's products
// with x rounded once to fp16 (a power-of-two scale per row and 128-wide K
// block; 2^-11 relative per value) instead of three float32-exact parts.

// absorbP1Smem is absorb_p1's dynamic shared memory (AP_SMEM).
const absorbP1Smem = 64*136*2 + 128*136*2 + 64*4

// AbsorbP1OK says whether AbsorbQP1 / AbsorbVP1 take these shapes here
// (AbsorbTCOK's conditions: sm_89+, R a multiple of 128, weights 16-byte
// aligned).
func (k *Set) AbsorbP1OK(w cuda.DevPtr, R int) bool { return k.AbsorbTCOK(w, R) }

func (k *Set) absorbP1(s cuda.Stream, out, x, w, scale cuda.DevPtr, mode, M, H, K, N, R, ldx, hs, ldo int, vec bool) error {
	if !k.AbsorbP1OK(w, R) || M <= 0 || H <= 0 || H > 65535 || K <= 0 || N <= 0 || M > 64*65535 {
		return errors.Newf("absorb p1: M=%d H=%d K=%d N=%d R=%d (multiple of 128), sm_89+, aligned weights", M, H, K, N, R)
	}
	f, err := k.fn("absorb_p1")
	if err != nil {
		return err
	}
	if _, ok := bigShared.Load(f); !ok {
		if err := k.c.SetMaxDynamicShared(f, absorbP1Smem); err != nil {
			return errors.WithHint(err, "absorb_p1 needs 52 KB of shared memory a block; TILERT_GPU_ABSORB_P1=0 keeps the three-part absorbs")
		}
		bigShared.Store(f, true)
	}
	nout := R
	if mode == 1 {
		nout = N
	}
	v := 0
	if vec {
		v = 1
	}
	return k.launchFn(f, cuda.D3(cdiv(nout, 128), H, cdiv(M, 64)), cuda.D1(256), absorbP1Smem, s, x, w, scale, out, mode, M, H, K, N, R, ldx, hs, ldo, v)
}

// AbsorbQP1 is AbsorbQTC with x rounded once: out[m][h][c] = sum_d
// fp16r(q[m*ldq + h*hs + d] * scale[h*nope + d][c/128]) * W[h*nope + d][c],
// fp16r rounding to fp16 after a power-of-two scale per (row, head, 128
// columns of c, 128-wide block of d).
func (k *Set) AbsorbQP1(s cuda.Stream, out, q, w, scale cuda.DevPtr, M, H, nope, R, ldq, hs int) error {
	if hs < nope || ldq < (H-1)*hs+nope {
		return errors.Newf("absorb q p1: nope=%d hs=%d ldq=%d", nope, hs, ldq)
	}
	vec := nope%4 == 0 && hs%4 == 0 && ldq%4 == 0 && uint64(q)%16 == 0
	return k.absorbP1(s, out, q, w, scale, 0, M, H, nope, 1, R, ldq, hs, 0, vec)
}

// AbsorbVP1 is AbsorbVTC with x rounded once: out[m*ldo + h*vd + v] = sum_c
// fp16r(x[(m*H + h)*R + c]) * W[h*vd + v][c] * scale[h*vd + v][c/128],
// fp16r rounding to fp16 after a power-of-two scale per (row, head,
// 128-wide block of c).
func (k *Set) AbsorbVP1(s cuda.Stream, out, x, w, scale cuda.DevPtr, M, H, vd, R, ldo int) error {
	if ldo < H*vd {
		return errors.Newf("absorb v p1: ldo=%d < H*vd=%d", ldo, H*vd)
	}
	return k.absorbP1(s, out, x, w, scale, 1, M, H, R, vd, R, 0, 0, ldo, uint64(x)%16 == 0)
}
