package gpu

import (
	"os"

	"github.com/tilert-go/tilert/cuda"
	"github.com/tilert-go/tilert/cuda/kernels"
	"github.com/tilert-go/tilert/engine/internal/kern"
)

// One-part absorbed-MLA products for serving-mode prefill: with the
// one-part GEMMs on (TILERT_GPU_GEMM=1 TILERT_GPU_GEMM_SPLITS=1, serving
// mode) a prefill forward's absorbQ (q_nope through W_UK) and absorbV (the
// latent output through W_UV) round x once to fp16 as gemm_p1 does
// (kernels.AbsorbQP1 / AbsorbVP1, gemm_p1_absorb.cu: a power-of-two scale
// per row and 128-wide K block; in q mode the weight scale is folded into
// x first) instead of absorb_tc's three float32-exact parts. Same
// condition as the GEMMs' one part (ops.gemmParts after forwardParts):
// exact mode and decode batches keep their float32 products.
// TILERT_GPU_ABSORB_P1=0 keeps the three-part absorbs with one-part GEMMs.
// The emulator transcribes the rounding (emuDevice.absorbQP1 / absorbVP1),
// so the emulated one-part forward includes it.
var absorbP1On = os.Getenv("TILERT_GPU_ABSORB_P1") != "0"

// absorbP1 says whether this forward's absorbs of M rows over fp8
// weights of R latent columns run with one part.
func (o *ops) absorbP1(fp8 bool, M, R int) bool {
	return absorbP1On && gemmOn && fp8 && o.gemmParts() == 1 && M >= gemmMinRows && R%128 == 0
}

// absorbQ is the device's absorbQ, or absorbQP1 where the forward runs
// one part (absorbP1).
func (o *ops) absorbQ(out, qpe, q, w, s cuda.DevPtr, fp8 bool, M, H, nope, R, ldq, hs, P int, rope kernels.QRope, qs kernels.QScale) error {
	if !qs.On() && o.absorbP1(fp8, M, R) {
		return o.b.absorbQP1(out, qpe, q, w, s, M, H, nope, R, ldq, hs, P, rope)
	}
	return o.b.absorbQ(out, qpe, q, w, s, fp8, M, H, nope, R, ldq, hs, P, rope, qs)
}

// absorbV is the device's absorbV, or absorbVP1 where the forward runs
// one part (absorbP1).
func (o *ops) absorbV(out, x, w, s cuda.DevPtr, fp8 bool, M, H, vd, R, ldo int) error {
	if o.absorbP1(fp8, M, R) {
		return o.b.absorbVP1(out, x, w, s, M, H, vd, R, ldo)
	}
	return o.b.absorbV(out, x, w, s, fp8, M, H, vd, R, ldo)
}

// absorbQP1 runs kernels.AbsorbQP1 and copies q's RoPE part out as
// absorbQTC does; a device without the kernel (pre-sm_89, unaligned
// weights) takes the three-part absorbQ.
func (b *cudaDevice) absorbQP1(out, qpe, q, w, s cuda.DevPtr, M, H, nope, R, ldq, hs, P int, rope kernels.QRope) error {
	if !b.k.AbsorbP1OK(w, R) {
		return b.absorbQ(out, qpe, q, w, s, true, M, H, nope, R, ldq, hs, P, rope, kernels.QScale{})
	}
	if err := b.k.AbsorbQP1(b.s, out, q, w, s, M, H, nope, R, ldq, hs); err != nil || qpe == 0 {
		return err
	}
	return b.qpeOut(qpe, q, M, H, nope, ldq, hs, P, rope)
}

func (b *cudaDevice) absorbVP1(out, x, w, s cuda.DevPtr, M, H, vd, R, ldo int) error {
	if !b.k.AbsorbP1OK(w, R) {
		return b.absorbV(out, x, w, s, true, M, H, vd, R, ldo)
	}
	return b.k.AbsorbVP1(b.s, out, x, w, s, M, H, vd, R, ldo)
}

func (gb *graphDevice) absorbQP1(out, qpe, q, w, s cuda.DevPtr, M, H, nope, R, ldq, hs, P int, rope kernels.QRope) error {
	// Named as the three-part call (the profile's absorbQ row); the
	// trailing 1 keeps the two apart in the graph key.
	return gb.rec("absorbQ", int64(H*nope*R), func(b device) error { return b.absorbQP1(out, qpe, q, w, s, M, H, nope, R, ldq, hs, P, rope) },
		ku(out), ku(qpe), ku(q), ku(w), ku(s), kb(true), ki(M), ki(H), ki(nope), ki(R), ki(ldq), ki(hs), ki(P),
		ku(rope.Pos), ku(rope.Cos), ku(rope.Sin), kb(rope.Interleaved), ki(1))
}

func (gb *graphDevice) absorbVP1(out, x, w, s cuda.DevPtr, M, H, vd, R, ldo int) error {
	return gb.rec("absorbV", int64(H*vd*R), func(b device) error { return b.absorbVP1(out, x, w, s, M, H, vd, R, ldo) },
		ku(out), ku(x), ku(w), ku(s), kb(true), ki(M), ki(H), ki(vd), ki(R), ki(ldo), ki(1))
}

// absorbQP1 transcribes absorb_p1's q mode (gemm_p1_absorb.cu): for each
// row, head and 128 output columns c (block cb), x_d = q_d *
// S[h*nope + d][cb] (float32), rounded per 128-wide block of d by p1Split
// (fp16 after the power of two that brings the block's largest |x| into
// [2^14, 2^15)), times the raw e4m3 weights; q's RoPE part as absorbQ.
func (m *emuDevice) absorbQP1(out, qpe, q, w, s cuda.DevPtr, M, H, nope, R, ldq, hs, P int, rope kernels.QRope) error {
	if err := m.qRopePart(qpe, q, M, H, nope, ldq, hs, P, rope); err != nil {
		return err
	}
	rb := (R + 127) / 128
	ones := make([]float32, rb)
	for i := range ones {
		ones[i] = 1
	}
	raw := make([]float32, nope*R) // one head's raw e4m3 weights [d][c]
	xs, xq := make([]float32, nope), make([]float32, nope)
	for h := 0; h < H; h++ {
		for d := 0; d < nope; d++ {
			fp8Row(raw[d*R:(d+1)*R], m.mem(w.Add(int64((h*nope+d)*R)), R), ones)
		}
		sc := m.f32(s.Add(int64(4*h*nope*rb)), nope*rb)
		for r := 0; r < M; r++ {
			qs := m.f32(q.Add(int64(4*(r*ldq+h*hs))), nope)
			o := m.f32(out.Add(int64(4*(r*H+h)*R)), R)
			clear(o)
			for cb := 0; cb < rb; cb++ {
				for d := range qs {
					xs[d] = qs[d] * sc[d*rb+cb]
				}
				for k0 := 0; k0 < nope; k0 += 128 {
					k1 := min(nope, k0+128)
					p1Split(xq[k0:k1], xs[k0:k1])
				}
				c0, c1 := cb*128, min(R, cb*128+128)
				for d := 0; d < nope; d++ {
					kern.Axpy(o[c0:c1], xq[d], raw[d*R+c0:d*R+c1])
				}
			}
		}
	}
	return nil
}

// absorbVP1 transcribes absorb_p1's v mode: each (row, head) latent
// rounded per 128-wide block by p1Split, times the dequantised W_UV rows.
func (m *emuDevice) absorbVP1(out, x, w, s cuda.DevPtr, M, H, vd, R, ldo int) error {
	row := make([]float32, R)
	xr := make([]float32, R)
	for r := 0; r < M; r++ {
		o := m.f32(out.Add(int64(4*r*ldo)), H*vd)
		for h := 0; h < H; h++ {
			xs := m.f32(x.Add(int64(4*(r*H+h)*R)), R)
			for k0 := 0; k0 < R; k0 += 128 {
				k1 := min(R, k0+128)
				p1Split(xr[k0:k1], xs[k0:k1])
			}
			for v := 0; v < vd; v++ {
				m.headRow(row, w, s, true, h*vd+v, R)
				o[h*vd+v] = kern.Dot(row, xr)
			}
		}
	}
	return nil
}
