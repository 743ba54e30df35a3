package gpu

import (
	"encoding/binary"
	"math"

	"github.com/cockroachdb/errors"

	"github.com/tilert-go/tilert/cuda"
	"github.com/tilert-go/tilert/cuda/kernels"
	"github.com/tilert-go/tilert/numeric"
)

// mlaPrefillH1 is mla_prefill_h1's rounding (cu/mla_tc_prefill_h1.cu,
// TILERT_GPU_MLA_PREFILL=4) on the host, so the engine checks can be run
// with one fp16 part without a GPU: each head's queries scaled by a power
// of two (max |q| into [2^14, 2^15)) and rounded to fp16; the entries as
// the kernel converts them (latent fp16(fp16(e4m3 x fp16(scale x 2^-E)) x
// 2^E), RoPE bf16 -> fp16); the probabilities rounded to fp16 for P.V
// while the row sum takes them unrounded, each probability rounded as
// exp(s - m) against the running max m after its 64-position tile (the
// kernel's online softmax), then scaled to the row's max. Products and
// sums in float64 (the device's float32 sums differ far below these
// roundings). emuH1Round = false drops every rounding (the float math of
// mlaDecode: checks this transcription's gather, masking and softmax).
var emuH1Round = true

func h1R(v float32) float32 {
	if emuH1Round {
		return f16Round(v)
	}
	return v
}

func (m *emuDevice) mlaPrefillH1(out, qn, qp, cache, indices, lens cuda.DevPtr, nq, H, nidx, ldIdx int, scale float32) error {
	const R, P = kernels.MLALatentDim, kernels.MLARopeDim
	if nq <= 0 || H <= 0 || nidx <= 0 || ldIdx < nidx || indices == 0 {
		return errors.Newf("emu mlaPrefillH1: nq=%d H=%d nidx=%d ldIdx=%d indices=%#x", nq, H, nidx, ldIdx, uint64(indices))
	}
	ls := m.i32(lens, nq)
	for i := 0; i < nq; i++ {
		var toks, pos []int
		for j, t := range m.i32(indices.Add(int64(4*i*ldIdx)), nidx) {
			if t >= 0 && t < ls[i] {
				toks = append(toks, int(t))
				pos = append(pos, j)
			}
		}
		k := make([]float64, len(toks)*(R+P))
		for j, t := range toks {
			h1EntryRow(k[j*(R+P):(j+1)*(R+P)], m.mem(cache.Add(int64(t*kernels.MLATokenBytes)), kernels.MLATokenBytes))
		}
		q := make([]float64, R+P)
		s := make([]float64, len(toks))
		for h := 0; h < H; h++ {
			ql := m.f32(qn.Add(int64(4*(i*H+h)*R)), R)
			qr := m.f32(qp.Add(int64(4*(i*H+h)*P)), P)
			var mx float32
			for _, v := range ql {
				mx = max(mx, float32(math.Abs(float64(v))))
			}
			for _, v := range qr {
				mx = max(mx, float32(math.Abs(float64(v))))
			}
			e := 0
			if mx > 0 {
				e = 14 - (int(math.Float32bits(mx)>>23&0xff) - 127)
			}
			e = min(max(e, -126), 126)
			f, inv := float32(math.Ldexp(1, e)), math.Ldexp(1, -e)
			for d, v := range ql {
				q[d] = float64(h1R(v*f)) * inv
			}
			for d, v := range qr {
				q[R+d] = float64(h1R(v*f)) * inv
			}
			o := m.f32(out.Add(int64(4*(i*H+h)*R)), R)
			clear(o)
			if len(toks) == 0 {
				continue
			}
			mxs := math.Inf(-1)
			for j := range toks {
				var d float64
				for c, kv := range k[j*(R+P) : (j+1)*(R+P)] {
					d += q[c] * kv
				}
				s[j] = d * float64(scale)
				mxs = math.Max(mxs, s[j])
			}
			acc := make([]float64, R)
			var l float64
			run := math.Inf(-1) // the running max after each tile
			for j := range toks {
				if j == 0 || pos[j]/64 != pos[j-1]/64 {
					for jj := j; jj < len(toks) && pos[jj]/64 == pos[j]/64; jj++ {
						run = math.Max(run, s[jj])
					}
				}
				l += math.Exp(s[j] - mxs)
				ph := float64(h1R(float32(math.Exp(s[j]-run)))) * math.Exp(run-mxs)
				for c := range R {
					acc[c] += ph * k[j*(R+P)+c]
				}
			}
			for c := range R {
				o[c] = float32(acc[c] / l)
			}
		}
	}
	return nil
}

// h1EntryRow writes one fp8_ds_mla entry as mla_prefill_h1 converts it:
// 512 latent values then 64 RoPE values, each an fp16 value.
func h1EntryRow(dst []float64, src []byte) {
	const R = kernels.MLALatentDim
	for g := 0; g < R/128; g++ {
		sc := math.Float32frombits(binary.LittleEndian.Uint32(src[R+4*g:]))
		E := int(math.Float32bits(sc)>>23&0xff) - 127
		E = min(max(E, -24), 15)
		m16 := h1R(sc * float32(math.Ldexp(1, -E)))
		p2 := float32(math.Ldexp(1, E))
		for i := 0; i < 128; i++ {
			// e4m3 x fp16 is exact in float32 (4 + 11 bits), as is x 2^E.
			dst[g*128+i] = float64(h1R(h1R(numeric.FP8E4M3ToFloat32(src[g*128+i])*m16) * p2))
		}
	}
	ro := R + 4*(R/128)
	for i := 0; i < kernels.MLARopeDim; i++ {
		dst[R+i] = float64(h1R(numeric.BF16ToFloat32(binary.LittleEndian.Uint16(src[ro+2*i:]))))
	}
}
