package kernels

import (
	"fmt"

	"github.com/cockroachdb/errors"

	"github.com/tilert-go/tilert/cuda"
)

// Tensor-core GEMMs for many rows (gemm_tc.cu): the prefill's linear layers.
const (
	GemmTileRows = 64  // rows of x per block (expert tiles hold at most this many)
	gemmTileN    = 128 // outputs per block
)

// GemmSplits is how many bf16 parts x is split into (gemm_tc.cu): 3 keeps
// every bit of a float32 (the result is the float32 GEMV's up to summation
// order), 2 keeps 16 bits of mantissa (relative error ~2^-17 per product).
var gemmSplitsOK = map[int]bool{2: true, 3: true}

func checkGemm(N, K, M, ldx, ldy, splits int) error {
	if N <= 0 || K <= 0 || M <= 0 || ldx < K || ldy < N {
		return errors.Newf("gemm: N=%d K=%d M=%d ldx=%d ldy=%d (need positive sizes, ldx >= K, ldy >= N)", N, K, M, ldx, ldy)
	}
	if !gemmSplitsOK[splits] {
		return errors.Newf("gemm: %d splits of x (2 or 3)", splits)
	}
	return nil
}

// gemmVec says whether the 16-byte load path applies: W rows of K weights of
// esize bytes and x rows both 16-byte aligned.
func gemmVec(w, x cuda.DevPtr, K, ldx, esize int) int32 {
	if (K*esize)%16 == 0 && ldx%4 == 0 && uint64(w)%16 == 0 && uint64(x)%16 == 0 {
		return 1
	}
	return 0
}

// GemmFP8 computes y[m][n] = sum_k w[n][k]*scale[n/128][k/128]*x[m][k] for
// m < M with tensor cores (any M; meant for M >= 16, where it beats the
// GEMVs): w fp8 e4m3 [N][K], scale float32 [ceil(N/128)][ceil(K/128)], x and
// y float32 with row strides ldx, ldy. splits: 3 (float32-exact products) or 2.
func (k *Set) GemmFP8(s cuda.Stream, y, x, w, scale cuda.DevPtr, N, K, M, ldx, ldy, splits int) error {
	if err := checkGemm(N, K, M, ldx, ldy, splits); err != nil {
		return err
	}
	return k.launch(fmt.Sprintf("gemm_fp8_tc_s%d", splits), cuda.D3(cdiv(N, gemmTileN), cdiv(M, GemmTileRows), 1), cuda.D1(256), 0, s,
		w, scale, x, y, N, K, M, ldx, ldy, gemmVec(w, x, K, ldx, 1))
}

// GemmBF16 is GemmFP8 for bf16 weights without scales.
func (k *Set) GemmBF16(s cuda.Stream, y, x, w cuda.DevPtr, N, K, M, ldx, ldy, splits int) error {
	if err := checkGemm(N, K, M, ldx, ldy, splits); err != nil {
		return err
	}
	return k.launch(fmt.Sprintf("gemm_bf16_tc_s%d", splits), cuda.D3(cdiv(N, gemmTileN), cdiv(M, GemmTileRows), 1), cuda.D1(256), 0, s,
		w, x, y, N, K, M, ldx, ldy, gemmVec(w, x, K, ldx, 2))
}

// GemmFP8Experts runs the routed experts of many rows in one launch. Rows
// ("pairs" of a token and one of its experts) are sorted by expert; tiles
// [ntiles][3] int32 lists (expert, first pair, pairs) with at most
// GemmTileRows pairs each; pair p reads x row xrows[p] (ldx floats apart)
// and writes y row p ([pairs][N]). wTable/sTable are the device tables of
// per-expert weight and scale pointers ([N][K] fp8 each, 16-byte aligned).
func (k *Set) GemmFP8Experts(s cuda.Stream, y, x cuda.DevPtr, ldx int, wTable, sTable, tiles, xrows cuda.DevPtr, ntiles, N, K, splits int) error {
	if err := checkGemm(N, K, 1, ldx, N, splits); err != nil {
		return err
	}
	if ntiles <= 0 || ntiles > 65535 {
		return errors.Newf("gemm experts: %d tiles (1..65535)", ntiles)
	}
	vec := int32(0)
	if K%16 == 0 && ldx%4 == 0 && uint64(x)%16 == 0 {
		vec = 1 // expert stacks are 256-byte aligned
	}
	return k.launch(fmt.Sprintf("gemm_fp8_experts_tc_s%d", splits), cuda.D3(cdiv(N, gemmTileN), ntiles, 1), cuda.D1(256), 0, s,
		wTable, sTable, tiles, xrows, x, ldx, y, N, K, vec)
}

// MoECombineRows computes out[m][n] = sum_j wts[m*k+j] * ey[pos[m*k+j]][n]
// (j in order, as MoECombine) for rows rows: the routed experts' weighted
// sum after GemmFP8Experts, pos mapping each (row, slot) to its pair.
func (k *Set) MoECombineRows(s cuda.Stream, out, ey, wts, pos cuda.DevPtr, rows, kslots, N int) error {
	if rows <= 0 || rows > 65535 || kslots <= 0 || N <= 0 {
		return errors.Newf("moe_combine_rows: rows=%d k=%d N=%d", rows, kslots, N)
	}
	return k.launch("moe_combine_rows", cuda.D3(cdiv(N, 256), rows, 1), cuda.D1(256), 0, s, out, ey, wts, pos, kslots, N)
}
