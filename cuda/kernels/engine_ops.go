package kernels

import (
	"github.com/cockroachdb/errors"

	"github.com/tilert-go/tilert/cuda"
)

// Launchers for kernels/engine.cu: the pieces the decode engine (engine/gpu)
// needs beyond the forward kernels above.

// EngMLACacheWrite stores n rows of src ([n][ld] floats: 512 latent then 64
// RoPE values) as fp8_ds_mla entries at token positions pos[i] (int32 on the
// device, <0 skipped) of a contiguous MLA cache region, rounding the latent
// to bf16 first and using scale max(amax/448, FLT_MIN) (engine.EncodeMLAFP8).
func (k *Set) EngMLACacheWrite(s cuda.Stream, cache, src, pos cuda.DevPtr, n, ld int) error {
	if n <= 0 || ld < MLALatentDim+MLARopeDim || ld%4 != 0 {
		return errors.Newf("eng mla cache write: n=%d ld=%d (ld >= 576, a multiple of 4)", n, ld)
	}
	return k.launch("eng_mla_cache_write", cuda.D1(n), cuda.D1(128), 0, s, src, ld, cache, pos)
}

// EngIndexerCacheWrite stores n indexer keys (128 floats, row stride ld) at
// positions pos[i] of a contiguous indexer cache region
// (engine.EncodeIndexerKey: bf16-rounded, ue8m0 scale of max(amax,1e-4)/448).
func (k *Set) EngIndexerCacheWrite(s cuda.Stream, cache, src, pos cuda.DevPtr, n, ld int) error {
	if n <= 0 || ld < IndexerHeadDim || ld%4 != 0 {
		return errors.Newf("eng indexer cache write: n=%d ld=%d", n, ld)
	}
	return k.launch("eng_indexer_cache_write", cuda.D1(n), cuda.D1(32), 0, s, src, ld, cache, pos)
}

// EngQuantUE8M0 round-trips n floats (a multiple of 128) through fp8 e4m3
// with a power-of-two scale per 128 (engine.QuantFP8UE8M0), in place.
func (k *Set) EngQuantUE8M0(s cuda.Stream, x cuda.DevPtr, n int) error {
	if n <= 0 || n%128 != 0 {
		return errors.Newf("eng quant ue8m0: n=%d (a positive multiple of 128)", n)
	}
	return k.launch("eng_quant_ue8m0", cuda.D1(n/128), cuda.D1(32), 0, s, x)
}

// EngCopy2D copies rows x cols floats between row strides lds and ldd.
func (k *Set) EngCopy2D(s cuda.Stream, dst, src cuda.DevPtr, rows, cols, ldd, lds int) error {
	if rows <= 0 || cols <= 0 || ldd < cols || lds < cols {
		return errors.Newf("eng copy2d: rows=%d cols=%d ldd=%d lds=%d", rows, cols, ldd, lds)
	}
	return k.launch("eng_copy2d", cuda.D1(cdiv(rows*cols, 256)), cuda.D1(256), 0, s, dst, src, rows, cols, ldd, lds)
}

// EngScale multiplies n floats by a in place.
func (k *Set) EngScale(s cuda.Stream, x cuda.DevPtr, a float32, n int) error {
	if n <= 0 {
		return errors.Newf("eng scale: n=%d", n)
	}
	return k.launch("eng_scale", cuda.D1(cdiv(n, 256)), cuda.D1(256), 0, s, x, a, n)
}

// EngAbsorbQ is the absorbed-MLA query product: out[m][h][c] =
// sum_d W[h][d][c]*q[m*ldq + h*hs + d] for c < R, M rows, H heads; W is W_UK
// [H][nope][R], fp8 e4m3 with per-row scales S [H][nope][ceil(R/128)]
// (fp8 true) or float32 (S ignored).
func (k *Set) EngAbsorbQ(s cuda.Stream, out, q, w, scale cuda.DevPtr, fp8 bool, M, H, nope, R, ldq, hs int) error {
	if M <= 0 || H <= 0 || nope <= 0 || R <= 0 || hs < nope || ldq < (H-1)*hs+nope || (fp8 && scale == 0) {
		return errors.Newf("eng absorb q: M=%d H=%d nope=%d R=%d ldq=%d hs=%d", M, H, nope, R, ldq, hs)
	}
	return k.launch("eng_absorb_q", cuda.D3(H, M, 1), cuda.D1(128), 0, s, out, q, w, scale, b2i(fp8), nope, R, ldq, hs)
}

// EngAbsorbV is the absorbed-MLA output product: out[m*ldo + h*vd + v] =
// sum_c W[h][v][c]*x[m][h][c]; W is W_UV [H][vd][R] in the forms of
// EngAbsorbQ, x is [M][H][R].
func (k *Set) EngAbsorbV(s cuda.Stream, out, x, w, scale cuda.DevPtr, fp8 bool, M, H, vd, R, ldo int) error {
	if M <= 0 || H <= 0 || vd <= 0 || R <= 0 || ldo < H*vd || (fp8 && scale == 0) {
		return errors.Newf("eng absorb v: M=%d H=%d vd=%d R=%d ldo=%d", M, H, vd, R, ldo)
	}
	return k.launch("eng_absorb_v", cuda.D3(H*cdiv(vd, 32), M, 1), cuda.D1(128), 0, s, out, x, w, scale, b2i(fp8), vd, R, ldo)
}

// Wide caches (kernels/exact.cu): the float32 MLA and indexer caches of the
// engine's exact mode and vLLM's bf16 MLA cache. Regions are contiguous,
// position p at p times the entry size.
const (
	MLAF32TokenBytes  = 4 * (MLALatentDim + MLARopeDim) // 2304
	MLABF16TokenBytes = 2 * (MLALatentDim + MLARopeDim) // 1152
	IndexerF32Bytes   = 4 * IndexerHeadDim              // 512 per token
)

// EngMLACacheWriteF32 stores n rows of src ([n][ld] floats: 512 latent then
// 64 RoPE values) unchanged as float32 entries at positions pos[i] (<0
// skipped).
func (k *Set) EngMLACacheWriteF32(s cuda.Stream, cache, src, pos cuda.DevPtr, n, ld int) error {
	if n <= 0 || ld < MLALatentDim+MLARopeDim {
		return errors.Newf("eng mla cache write f32: n=%d ld=%d (ld >= 576)", n, ld)
	}
	return k.launch("eng_mla_cache_write_f32", cuda.D1(n), cuda.D1(128), 0, s, src, ld, cache, pos)
}

// EngMLACacheWriteBF16 is EngMLACacheWriteF32 for vLLM's bf16 MLA cache
// (engine.EncodeMLABF16: every value rounded to bf16, RNE).
func (k *Set) EngMLACacheWriteBF16(s cuda.Stream, cache, src, pos cuda.DevPtr, n, ld int) error {
	if n <= 0 || ld < MLALatentDim+MLARopeDim {
		return errors.Newf("eng mla cache write bf16: n=%d ld=%d (ld >= 576)", n, ld)
	}
	return k.launch("eng_mla_cache_write_bf16", cuda.D1(n), cuda.D1(128), 0, s, src, ld, cache, pos)
}

// EngIndexerCacheWriteF32 stores n indexer keys (128 floats, row stride ld)
// unchanged at positions pos[i] (<0 skipped) of a float32 key cache.
func (k *Set) EngIndexerCacheWriteF32(s cuda.Stream, cache, src, pos cuda.DevPtr, n, ld int) error {
	if n <= 0 || ld < IndexerHeadDim || ld%4 != 0 {
		return errors.Newf("eng indexer cache write f32: n=%d ld=%d", n, ld)
	}
	return k.launch("eng_indexer_cache_write_f32", cuda.D1(n), cuda.D1(32), 0, s, src, ld, cache, pos)
}

// EngIndexerScoresF32 is IndexerScores over a float32 key cache (contiguous,
// no block table): out[q][t] = sum_h w[q][h]*ReLU(qkScale * q[q][h].k_t) for
// t < lens[q], -inf for lens[q] <= t < T.
func (k *Set) EngIndexerScoresF32(s cuda.Stream, out, q, w, cache, lens cuda.DevPtr, nq, H, T, ldOut int, qkScale float32) error {
	if nq <= 0 || H <= 0 || T <= 0 || ldOut < T {
		return errors.Newf("eng indexer f32: nq=%d H=%d T=%d ldOut=%d", nq, H, T, ldOut)
	}
	return k.launch("eng_indexer_scores_f32", cuda.D3(cdiv(T, IndexerPageTokens), nq, 1), cuda.D1(256), 0, s, q, w, cache, lens, out, H, T, ldOut, qkScale)
}

// EngMLADecodeF32 is MLADecode (unsplit, contiguous cache) over the float32
// MLA cache: qn [nq][H][512], qp [nq][H][64], out [nq][H][512]; indices
// [nq][ldIdx] with nidx used per row (<0 or >= lens skipped), or 0 for every
// t < lens[q].
func (k *Set) EngMLADecodeF32(s cuda.Stream, out, qn, qp, cache, indices, lens cuda.DevPtr, nq, H, nidx, ldIdx int, scale float32) error {
	return k.mlaDecodeWide("eng_mla_decode_f32", s, out, qn, qp, cache, indices, lens, nq, H, nidx, ldIdx, scale)
}

// EngMLADecodeBF16 is EngMLADecodeF32 over the bf16 MLA cache.
func (k *Set) EngMLADecodeBF16(s cuda.Stream, out, qn, qp, cache, indices, lens cuda.DevPtr, nq, H, nidx, ldIdx int, scale float32) error {
	return k.mlaDecodeWide("eng_mla_decode_bf16", s, out, qn, qp, cache, indices, lens, nq, H, nidx, ldIdx, scale)
}

func (k *Set) mlaDecodeWide(name string, s cuda.Stream, out, qn, qp, cache, indices, lens cuda.DevPtr, nq, H, nidx, ldIdx int, scale float32) error {
	if nq <= 0 || H <= 0 || nidx <= 0 || (indices != 0 && ldIdx < nidx) {
		return errors.Newf("%s: nq=%d H=%d nidx=%d ldIdx=%d", name, nq, H, nidx, ldIdx)
	}
	return k.launch(name, cuda.D3(H, nq, 1), cuda.D1(128), 0, s, qn, qp, cache, indices, ldIdx, nidx, lens, out, H, scale)
}
