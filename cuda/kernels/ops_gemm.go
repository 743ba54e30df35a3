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
// order), 2 keeps 16 bits of mantissa (relative error ~2^-17 per product),
// 1 rounds x to bf16 once (2^-9 relative per value: serving-mode prefill
// only, as HF's bf16 prefill; the fp8 GEMMs then take gemm_p1.cu).
var gemmSplitsOK = map[int]bool{1: true, 2: true, 3: true}

func checkGemm(N, K, M, ldx, ldy, splits int) error {
	if N <= 0 || K <= 0 || M <= 0 || ldx < K || ldy < N {
		return errors.Newf("gemm: N=%d K=%d M=%d ldx=%d ldy=%d (need positive sizes, ldx >= K, ldy >= N)", N, K, M, ldx, ldy)
	}
	if !gemmSplitsOK[splits] {
		return errors.Newf("gemm: %d splits of x (1, 2 or 3)", splits)
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

// GemmExpertBigRows is the pairs a "big" expert tile holds (the 128-row
// blocks of gemm_fp8_experts_p1_b4); other tiles hold at most GemmTileRows.
const GemmExpertBigRows = 128

// ExpertTiles cuts the expert-sorted pairs (eid[i]: the expert of sorted
// pair i, non-decreasing) into the grouped GEMM's tiles, (expert, first
// pair, pairs) each: with big set, every expert's pairs run as tiles of
// GemmExpertBigRows, and a rest of at most GemmTileRows as one small tile;
// big tiles come first (nbig of them). Without big, tiles of at most
// GemmTileRows (nbig 0).
func ExpertTiles(eid []int32, big bool) (tiles []int32, nbig int) {
	var small []int32
	for i := 0; i < len(eid); {
		j := i
		for j < len(eid) && eid[j] == eid[i] {
			j++
		}
		for i < j {
			n := j - i
			switch {
			case big && n > GemmTileRows:
				n = min(n, GemmExpertBigRows)
				tiles = append(tiles, eid[i], int32(i), int32(n))
				nbig++
			default:
				n = min(n, GemmTileRows)
				small = append(small, eid[i], int32(i), int32(n))
			}
			i += n
		}
	}
	return append(tiles, small...), nbig
}

// absorbTCSmem is absorb_tc's dynamic shared memory (AT_SMEM).
const absorbTCSmem = 3*64*136*2 + 128*144 + 64*4

// AbsorbTCOK says whether AbsorbQTC / AbsorbVTC take these shapes here:
// sm_89 or newer, R a multiple of 128, weights 16-byte aligned.
func (k *Set) AbsorbTCOK(w cuda.DevPtr, R int) bool {
	in := k.c.Info()
	return in.CCMajor*10+in.CCMinor >= 89 && R > 0 && R%128 == 0 && uint64(w)%16 == 0
}

func (k *Set) absorbTC(s cuda.Stream, out, x, w, scale cuda.DevPtr, mode, M, H, K, N, R, ldx, hs, ldo int) error {
	if !k.AbsorbTCOK(w, R) || M <= 0 || H <= 0 || K <= 0 || N <= 0 || M > 64*65535 {
		return errors.Newf("absorb tc: M=%d H=%d K=%d N=%d R=%d (multiple of 128), sm_89+, aligned weights", M, H, K, N, R)
	}
	f, err := k.fn("absorb_tc")
	if err != nil {
		return err
	}
	if _, ok := bigShared.Load(f); !ok {
		if err := k.c.SetMaxDynamicShared(f, absorbTCSmem); err != nil {
			return errors.WithHint(err, "absorb_tc needs 71 KB of shared memory a block; TILERT_GPU_ABSORB_TC=0 keeps absorb_q_fp8 / absorb_v_fp8")
		}
		bigShared.Store(f, true)
	}
	nout := R
	if mode == 1 {
		nout = N
	}
	return k.launchFn(f, cuda.D3(cdiv(nout, 128), H, cdiv(M, 64)), cuda.D1(256), absorbTCSmem, s, x, w, scale, out, mode, M, H, K, N, R, ldx, hs, ldo)
}

// AbsorbQTC is AbsorbQFP8's product (without the RoPE part) on tensor
// cores for many rows: out[m][h][c] = sum_d q[m*ldq + h*hs + d] *
// W[h*nope + d][c] * scale[h*nope + d][c/128].
func (k *Set) AbsorbQTC(s cuda.Stream, out, q, w, scale cuda.DevPtr, M, H, nope, R, ldq, hs int) error {
	if hs < nope || ldq < (H-1)*hs+nope {
		return errors.Newf("absorb q tc: nope=%d hs=%d ldq=%d", nope, hs, ldq)
	}
	return k.absorbTC(s, out, q, w, scale, 0, M, H, nope, 1, R, ldq, hs, 0)
}

// AbsorbVTC is AbsorbVFP8 on tensor cores for many rows: out[m*ldo + h*vd
// + v] = sum_c x[(m*H + h)*R + c] * W[h*vd + v][c] * scale[h*vd + v][c/128].
func (k *Set) AbsorbVTC(s cuda.Stream, out, x, w, scale cuda.DevPtr, M, H, vd, R, ldo int) error {
	if ldo < H*vd {
		return errors.Newf("absorb v tc: ldo=%d < H*vd=%d", ldo, H*vd)
	}
	return k.absorbTC(s, out, x, w, scale, 1, M, H, R, vd, R, 0, 0, ldo)
}

// The one-part FP8 GEMMs (gemm_p1.cu, serving-mode prefill): x rounded once
// to fp16 after a power-of-two scale per row (2^-11 relative per value),
// K permuted inside 64-wide tiles so that one shared load gives a thread
// the weight bytes of four k16 steps; BM x 128 x 64 block tiles, a 4-stage
// cp.async ring.
const (
	gemmP1K      = 64 // Kp: K rounded up to this
	gemmP1Stages = 4
	// GemmP1DenseRows is the dense kernel's larger block height (the
	// other is 64).
	GemmP1DenseRows = 128
)

func gemmP1Smem(bm int) int { return gemmP1Stages * (bm*72*2 + gemmTileN*64) }

// GemmP1ScratchBytes is the scratch GemmFP8P1 / GemmFP8ExpertsP1 need for
// rows rows of x of K values: the fp16 rows (K rounded up to 64) and a
// float32 scale per row.
func GemmP1ScratchBytes(rows, K int) int64 {
	return 2*int64(rows)*int64(cdiv(K, gemmP1K)*gemmP1K) + 4*int64(rows) + 256
}

// GemmP1OK says whether the one-part FP8 GEMM takes a weight of K inputs
// at w here: sm_89 or newer (e4m3 conversions), K % 16 == 0, 16-byte
// aligned.
func (k *Set) GemmP1OK(w cuda.DevPtr, K int) bool {
	in := k.c.Info()
	return in.CCMajor*10+in.CCMinor >= 89 && K%16 == 0 && uint64(w)%16 == 0
}

// gemmSplitP1 rounds rows rows of x into scratch (gemm_split_p1); it
// returns the fp16 rows, their stride Kp in halves and the row scales.
func (k *Set) gemmSplitP1(s cuda.Stream, x, scratch cuda.DevPtr, scratchBytes int64, rows, K, ldx int) (xs cuda.DevPtr, Kp int, rs cuda.DevPtr, err error) {
	if rows <= 0 || K <= 0 || ldx < K {
		return 0, 0, 0, errors.Newf("gemm p1: rows=%d K=%d ldx=%d", rows, K, ldx)
	}
	if need := GemmP1ScratchBytes(rows, K); scratch == 0 || scratchBytes < need {
		return 0, 0, 0, errors.Newf("gemm p1: scratch of %d bytes for %d rows of %d (need %d)", scratchBytes, rows, K, need)
	}
	Kp = cdiv(K, gemmP1K) * gemmP1K
	rs = scratch.Add(2 * int64(rows) * int64(Kp))
	err = k.launch("gemm_split_p1", cuda.D1(rows), cuda.D1(256), 0, s, x, ldx, K, Kp, scratch, rs)
	return scratch, Kp, rs, err
}

func (k *Set) gemmP1Fn(name string, bm int) (*cuda.Function, error) {
	f, err := k.fn(fmt.Sprintf("%s_b%d", name, bm/32))
	if err != nil {
		return nil, err
	}
	if _, ok := bigShared.Load(f); !ok {
		if err := k.c.SetMaxDynamicShared(f, gemmP1Smem(bm)); err != nil {
			return nil, errors.WithHint(err, "the one-part GEMM needs "+fmt.Sprint(gemmP1Smem(bm))+" bytes of shared memory a block; TILERT_GPU_GEMM_SPLITS=3 uses the three-part kernels")
		}
		bigShared.Store(f, true)
	}
	return f, nil
}

// GemmFP8P1 is GemmFP8 with x rounded once to fp16 (per-row power-of-two
// scale; 2^-11 relative per value) through scratch (GemmP1ScratchBytes(M,
// K) bytes); bm is the block rows, 64 or 128 (GemmP1DenseRows).
func (k *Set) GemmFP8P1(s cuda.Stream, y, x, w, scale, scratch cuda.DevPtr, scratchBytes int64, N, K, M, ldx, ldy, bm int) error {
	if err := checkGemm(N, K, M, ldx, ldy, 1); err != nil {
		return err
	}
	if !k.GemmP1OK(w, K) || (bm != 64 && bm != 128) {
		return errors.Newf("gemm p1: K=%d (multiple of 16), w aligned to 16 bytes, sm_89+, block rows %d (64 or 128)", K, bm)
	}
	xs, Kp, rs, err := k.gemmSplitP1(s, x, scratch, scratchBytes, M, K, ldx)
	if err != nil {
		return err
	}
	f, err := k.gemmP1Fn("gemm_fp8_p1", bm)
	if err != nil {
		return err
	}
	blocks := cdiv(N, gemmTileN) * cdiv(M, bm)
	if blocks > 1<<31-1 {
		return errors.Newf("gemm p1: %d blocks", blocks)
	}
	return k.launchFn(f, cuda.D1(blocks), cuda.D1(256), gemmP1Smem(bm), s, w, scale, xs, Kp, rs, y, N, K, M, ldy)
}

// P1BlockRows picks the dense one-part GEMM's block rows: 64. On the H200
// (docs/measured/h200-2026-12-02/run2, gemm_p1 at every 8192-row prefill
// shape) 64-row blocks, two an SM, beat 128-row ones, one an SM, at every
// shape (18432x7168: 7.86 against 8.70 ms; 24576x1536: 2.21 against 2.90):
// the second block hides the other's pipeline stalls, which was worth more
// than the 128-row tile's doubled weight reuse. TILERT_GPU_GEMM_BM=128
// still asks for 128.
func P1BlockRows(N, M, sms int) int { return 64 }

// GemmFP8ExpertsP1 is GemmFP8Experts with x (xRows rows) rounded once to
// fp16 through scratch (GemmP1ScratchBytes(xRows, K) bytes): tiles [0,
// nbig) hold at most GemmExpertBigRows pairs (128-row blocks), the rest at
// most GemmTileRows (64-row blocks); x is rounded once for both.
func (k *Set) GemmFP8ExpertsP1(s cuda.Stream, y, x cuda.DevPtr, ldx, xRows int, wTable, sTable, tiles, xrows, scratch cuda.DevPtr, scratchBytes int64, ntiles, nbig, N, K int) error {
	if err := checkGemm(N, K, 1, ldx, N, 1); err != nil {
		return err
	}
	if ntiles <= 0 || ntiles > 65535 || nbig < 0 || nbig > ntiles {
		return errors.Newf("gemm experts p1: %d tiles (1..65535), %d of them big", ntiles, nbig)
	}
	if !k.GemmP1OK(0, K) {
		return errors.Newf("gemm experts p1: K=%d (multiple of 16), sm_89+", K)
	}
	xs, Kp, rs, err := k.gemmSplitP1(s, x, scratch, scratchBytes, xRows, K, ldx)
	if err != nil {
		return err
	}
	for _, l := range []struct{ bm, first, n int }{{GemmExpertBigRows, 0, nbig}, {GemmTileRows, nbig, ntiles - nbig}} {
		if l.n == 0 {
			continue
		}
		f, err := k.gemmP1Fn("gemm_fp8_experts_p1", l.bm)
		if err != nil {
			return err
		}
		if err := k.launchFn(f, cuda.D3(cdiv(N, gemmTileN), l.n, 1), cuda.D1(256), gemmP1Smem(l.bm), s,
			wTable, sTable, tiles.Add(12*int64(l.first)), xrows, xs, Kp, rs, y, N, K); err != nil {
			return err
		}
	}
	return nil
}
