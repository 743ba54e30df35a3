package gpu

import "github.com/cockroachdb/errors"

// Launchers for kernels/engine.cu: the pieces the decode engine (engine/gpu)
// needs beyond the forward kernels above.

// EngMLACacheWrite stores n rows of src ([n][ld] floats: 512 latent then 64
// RoPE values) as fp8_ds_mla entries at token positions pos[i] (int32 on the
// device, <0 skipped) of a contiguous MLA cache region, rounding the latent
// to bf16 first and using scale max(amax/448, FLT_MIN) (engine.EncodeMLAFP8).
func (k *Kernels) EngMLACacheWrite(s Stream, cache, src, pos DevPtr, n, ld int) error {
	if n <= 0 || ld < MLALatentDim+MLARopeDim || ld%4 != 0 {
		return errors.Newf("eng mla cache write: n=%d ld=%d (ld >= 576, a multiple of 4)", n, ld)
	}
	return k.launch("eng_mla_cache_write", D1(n), D1(128), 0, s, src, ld, cache, pos)
}

// EngIndexerCacheWrite stores n indexer keys (128 floats, row stride ld) at
// positions pos[i] of a contiguous indexer cache region
// (engine.EncodeIndexerKey: bf16-rounded, ue8m0 scale of max(amax,1e-4)/448).
func (k *Kernels) EngIndexerCacheWrite(s Stream, cache, src, pos DevPtr, n, ld int) error {
	if n <= 0 || ld < IndexerHeadDim || ld%4 != 0 {
		return errors.Newf("eng indexer cache write: n=%d ld=%d", n, ld)
	}
	return k.launch("eng_indexer_cache_write", D1(n), D1(32), 0, s, src, ld, cache, pos)
}

// EngQuantUE8M0 round-trips n floats (a multiple of 128) through fp8 e4m3
// with a power-of-two scale per 128 (engine.QuantFP8UE8M0), in place.
func (k *Kernels) EngQuantUE8M0(s Stream, x DevPtr, n int) error {
	if n <= 0 || n%128 != 0 {
		return errors.Newf("eng quant ue8m0: n=%d (a positive multiple of 128)", n)
	}
	return k.launch("eng_quant_ue8m0", D1(n/128), D1(32), 0, s, x)
}

// EngCopy2D copies rows x cols floats between row strides lds and ldd.
func (k *Kernels) EngCopy2D(s Stream, dst, src DevPtr, rows, cols, ldd, lds int) error {
	if rows <= 0 || cols <= 0 || ldd < cols || lds < cols {
		return errors.Newf("eng copy2d: rows=%d cols=%d ldd=%d lds=%d", rows, cols, ldd, lds)
	}
	return k.launch("eng_copy2d", D1(cdiv(rows*cols, 256)), D1(256), 0, s, dst, src, rows, cols, ldd, lds)
}

// EngScale multiplies n floats by a in place.
func (k *Kernels) EngScale(s Stream, x DevPtr, a float32, n int) error {
	if n <= 0 {
		return errors.Newf("eng scale: n=%d", n)
	}
	return k.launch("eng_scale", D1(cdiv(n, 256)), D1(256), 0, s, x, a, n)
}

// EngAbsorbQ is the absorbed-MLA query product: out[m][h][c] =
// sum_d W[h][d][c]*q[m*ldq + h*hs + d] for c < R, M rows, H heads; W is W_UK
// [H][nope][R], fp8 e4m3 with per-row scales S [H][nope][ceil(R/128)]
// (fp8 true) or float32 (S ignored).
func (k *Kernels) EngAbsorbQ(s Stream, out, q, w, scale DevPtr, fp8 bool, M, H, nope, R, ldq, hs int) error {
	if M <= 0 || H <= 0 || nope <= 0 || R <= 0 || hs < nope || ldq < (H-1)*hs+nope || (fp8 && scale == 0) {
		return errors.Newf("eng absorb q: M=%d H=%d nope=%d R=%d ldq=%d hs=%d", M, H, nope, R, ldq, hs)
	}
	return k.launch("eng_absorb_q", Dim3{H, M, 1}, D1(128), 0, s, out, q, w, scale, b2i(fp8), nope, R, ldq, hs)
}

// EngAbsorbV is the absorbed-MLA output product: out[m*ldo + h*vd + v] =
// sum_c W[h][v][c]*x[m][h][c]; W is W_UV [H][vd][R] in the forms of
// EngAbsorbQ, x is [M][H][R].
func (k *Kernels) EngAbsorbV(s Stream, out, x, w, scale DevPtr, fp8 bool, M, H, vd, R, ldo int) error {
	if M <= 0 || H <= 0 || vd <= 0 || R <= 0 || ldo < H*vd || (fp8 && scale == 0) {
		return errors.Newf("eng absorb v: M=%d H=%d vd=%d R=%d ldo=%d", M, H, vd, R, ldo)
	}
	return k.launch("eng_absorb_v", Dim3{H, M, 1}, D1(128), 0, s, out, x, w, scale, b2i(fp8), vd, R, ldo)
}
