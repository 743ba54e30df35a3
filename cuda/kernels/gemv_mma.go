package kernels

import (
	"fmt"
	"slices"
	"strings"

	"github.com/cockroachdb/errors"

	"github.com/tilert-go/tilert/cuda"
)

// Tensor-core GEMVs for a few input rows (gemv_mma.cu): each weight is
// converted once to bf16 and multiplied with every row by mma.sync, x split
// into three bf16 parts so that the products are float32's. For M >= 2
// rows, where the CUDA-core tile GEMV spends M FMAs per weight.

// forceMMART, forceMMAU, forceMMAP and forceMMAX pin the row tiles per
// block, chunks per stage, pipeline mode and kernel generation (X: 1
// gemv_mma_x.cu, 0 gemv_mma.cu) (tests and timing sweeps; 0 / -1:
// mmaShape chooses).
var (
	forceMMART, forceMMAU int
	forceMMAP, forceMMAX  = -1, -1
)

// MMARun1 keeps run 1's choices (gemv_mma.cu's variants everywhere;
// TILERT_GPU_GEMV_MMA=1); otherwise the launchers take run 2's fastest
// (docs/measured/h200-2026-12-03-s18 call B: gemv_mmx's two-register-stage
// `_p` variant for long fp8 rows, the paired gate/up and the indexer's
// wq_b; the grouped attention inputs on gemv_mmx_group_u4 since session 19).
var MMARun1 bool

// MMAGroupU2 puts the grouped attention inputs back on session 18's
// gemv_mmx_group_u2 (TILERT_GPU_GEMV_MMA=u2).
var MMAGroupU2 bool

// mmaVariant is a compiled kernel: RT row tiles of 16 per block, U chunks
// per stage, P the pipeline (0: load a stage, then multiply it; 1 (_p):
// two register stages, the next in flight while one is multiplied), X the
// second-iteration kernels of gemv_mma_x.cu. The cp.async pipeline (P 2,
// `_a`) was removed in session 19 (slowest of all on the H200; the code
// last lives in commit cb41896).
type mmaVariant struct {
	RT, U, P int
	X        bool
}

func (v mmaVariant) name(bf16 bool) string {
	n := "gemv_mma_fp8"
	if bf16 {
		n = "gemv_mma_bf16"
	}
	if v.X {
		n = strings.Replace(n, "mma", "mmx", 1)
	}
	n += fmt.Sprintf("_r%d_u%d", v.RT, v.U)
	if v.P == 1 {
		n += "_p"
	}
	return n
}

// mmaVariants are gemv_mma.cu's kernels for fp8 and bf16 weights (run on
// the H200: checked and timed, docs/measured/h200-2026-12-01-mrows/run1),
// mmaFP8Variants its kernels for fp8 only; mmxVariants gemv_mma_x.cu's
// (run 2, docs/measured/h200-2026-12-03-s18 call B), fp8 only. Of
// gemv_mma_x.cu's GEMVs only `_p` r2 u1 is left: r2 u2, the other `_p`
// shapes (r1 u1, r4 u1, r2 u2) and the cp.async `_a` (r1 u1, r2 u1) were
// slower than mmaShape's choice at every shape timed (session 19 call A;
// r1 u1 `_p` on the bf16 head at 2 rows within the spread) and no default
// or switch took them; removed in session 19, last in commit cb41896.
// Session 54 removed what mmaShape never picks (only tests pinned them):
// r1 u2 and r2 u4 of gemv_mma.cu, its bf16 r2 u2 and gemv_mma_x.cu's bf16
// `_p` (cuda/kernels/NOTES.md "Unreachable kernels removed").
var (
	mmaVariants    = []mmaVariant{{1, 4, 0, false}, {2, 1, 0, false}, {4, 1, 0, false}}
	mmaFP8Variants = []mmaVariant{{2, 2, 0, false}}
	mmxVariants    = []mmaVariant{{2, 1, 1, true}}
)

// mmaAllVariants is every compiled variant (for fp8 weights; bf16 has
// mmaVariants).
func mmaAllVariants() []mmaVariant { return slices.Concat(mmaVariants, mmaFP8Variants, mmxVariants) }

// mmaCompiled says whether variant v is compiled for the weights (bf16 or
// fp8).
func mmaCompiled(v mmaVariant, bf16 bool) bool {
	return slices.Contains(mmaVariants, v) || !bf16 && (slices.Contains(mmaFP8Variants, v) || slices.Contains(mmxVariants, v))
}

// mmaShape picks the variant for N rows of kbytes bytes. gemv_mma.cu's,
// from its H200 sweep (run 1, the fastest at M = 2, 4 and 8 alike): four
// row tiles a block for the paired gate/up (93.5 us against 95.7 with
// two) and for short rows with a large grid (q_b 24576x1536: 17.3 against
// 19.0-25.8); two tiles and one chunk a stage for other short rows (indexer
// wq_b 8192x1536: 7.4 against 8.0-10.2) and for bf16 (head: 461 against
// 475-562); two tiles and two chunks for long fp8 rows (o_proj 49.3 against
// 50.6-66.8, dense down 54.9 against 56.8-74.0); one tile and four chunks
// where two tiles leave SMs idle (q_a 1536 rows: 11.4 against 15.6).
func mmaShape(sms, N, kbytes int, bf16, pair bool) mmaVariant {
	sms = max(1, sms)
	// run2p: the second iteration's `_p` (the next stage's loads in flight
	// while one is multiplied), fastest in run 2's sweep at M = 2, 4 and 8
	// on o_proj (43.8 against 49.7 us at 4 rows), dense down (48.8 / 55.2),
	// the paired gate/up (88.2 / 93.6) and wq_b (6.8 / 7.3); q_b (r4),
	// q_a alone (r1 u4) and the bf16 head (r2 u1) keep run 1's.
	run2p := mmaVariant{2, 1, 1, true}
	var v mmaVariant
	switch {
	case pair && !MMARun1:
		v = run2p
	case pair:
		v = mmaVariant{4, 1, 0, false}
	case kbytes < 4096 && cdiv(N, 64) >= sms:
		v = mmaVariant{4, 1, 0, false}
	case cdiv(N, 32) < sms:
		v = mmaVariant{1, 4, 0, false}
	case bf16:
		v = mmaVariant{2, 1, 0, false}
	case !MMARun1:
		v = run2p
	case kbytes < 4096:
		v = mmaVariant{2, 1, 0, false}
	default:
		v = mmaVariant{2, 2, 0, false}
	}
	if f := forceMMART; f == 1 || f == 2 || f == 4 {
		v.RT = f
	}
	if f := forceMMAU; f > 0 {
		v.U = f
	}
	if f := forceMMAP; f == 0 || f == 1 {
		v.P = f
	}
	if f := forceMMAX; f >= 0 {
		v.X = f == 1
	}
	if pair && v.RT < 2 {
		v.RT = 2
	}
	// A pinned shape that is not compiled: each generation's long-row
	// kernel, bf16's (r2 u1) for bf16 (only tests pin; every choice above
	// is compiled).
	switch {
	case mmaCompiled(v, bf16):
	case bf16:
		v = mmaVariant{2, 1, 0, false}
	case v.X:
		v = run2p
	default:
		v = mmaVariant{2, 2, 0, false}
	}
	return v
}

// MMAOK says whether the tensor-core GEMV takes the shape: rows of whole
// 16-byte pieces (fp8 K % 16, bf16 K % 8), 16-byte aligned x rows and
// weights, 1..MaxTileM rows, and a device with bf16 mma.sync (sm_80+).
func (k *Set) MMAOK(x, w cuda.DevPtr, K, ldx, M, esize int) bool {
	info := k.c.Info()
	return info.CCMajor >= 8 && M >= 1 && M <= MaxTileM && K > 0 && (K*esize)%16 == 0 && ldx%4 == 0 &&
		uint64(x)%16 == 0 && uint64(w)%16 == 0
}

func (k *Set) mma(s cuda.Stream, bf16 bool, y, x, w0, s0, w1, s1, resid cuda.DevPtr, N, K, M, ldx, ldy int) error {
	if err := checkTile(N, K, M, ldx, ldy); err != nil {
		return err
	}
	esize := 1
	if bf16 {
		esize = 2
	}
	pair := w1 != 0
	if !k.MMAOK(x, w0, K, ldx, M, esize) || (pair && uint64(w1)%16 != 0) {
		return errors.Newf("gemv mma: K=%d ldx=%d M=%d x=%#x: needs K*%d %% 16 == 0, ldx %% 4 == 0, aligned x and w, sm_80+",
			K, ldx, M, uint64(x), esize)
	}
	if !bf16 && (s0 == 0 || (pair && s1 == 0)) {
		return errors.Newf("gemv mma: fp8 weights need their block scales")
	}
	v := mmaShape(k.c.Info().SMs, N, K*esize, bf16, pair)
	tout := v.RT
	if pair {
		tout = v.RT / 2
	}
	grid := cuda.D1(cdiv(N, 16*tout))
	f, err := k.fn(v.name(bf16))
	if err != nil {
		return err
	}
	if bf16 {
		return k.launchFn(f, grid, cuda.D1(256), 0, s, w0, w1, x, ldx, y, ldy, resid, N, K, M)
	}
	return k.launchFn(f, grid, cuda.D1(256), 0, s, w0, s0, w1, s1, x, ldx, y, ldy, resid, N, K, M)
}

// GemvFP8MMA is GemvFP8Tile on the tensor cores (same result up to float32
// summation order, reproducible run to run); shapes MMAOK refuses run
// GemvFP8Tile.
func (k *Set) GemvFP8MMA(s cuda.Stream, y, x, w, scale, resid cuda.DevPtr, N, K, M, ldx, ldy int) error {
	if !k.MMAOK(x, w, K, ldx, M, 1) {
		return k.GemvFP8Tile(s, y, x, w, scale, resid, N, K, M, ldx, ldy)
	}
	return k.mma(s, false, y, x, w, scale, 0, 0, resid, N, K, M, ldx, ldy)
}

// GemvBF16MMA is GemvBF16Tile on the tensor cores; shapes MMAOK refuses
// run GemvBF16Tile, or GemvBF16 below GemvBF16TileMinM rows.
func (k *Set) GemvBF16MMA(s cuda.Stream, y, x, w, resid cuda.DevPtr, N, K, M, ldx, ldy int) error {
	if !k.MMAOK(x, w, K, ldx, M, 2) {
		if M >= 1 && M < GemvBF16TileMinM {
			return k.GemvBF16(s, y, x, w, resid, N, K, M, ldx, ldy)
		}
		return k.GemvBF16Tile(s, y, x, w, resid, N, K, M, ldx, ldy)
	}
	return k.mma(s, true, y, x, w, 0, 0, 0, resid, N, K, M, ldx, ldy)
}

// GateUpFP8MMA is GateUpFP8 on the tensor cores; shapes MMAOK refuses run
// GateUpFP8.
func (k *Set) GateUpFP8MMA(s cuda.Stream, y, x, wg, sg, wu, su cuda.DevPtr, N, K, M, ldx, ldy int) error {
	if !k.MMAOK(x, wg, K, ldx, M, 1) || uint64(wu)%16 != 0 || wu == 0 {
		return k.GateUpFP8(s, y, x, wg, sg, wu, su, N, K, M, ldx, ldy)
	}
	return k.mma(s, false, y, x, wg, sg, wu, su, 0, N, K, M, ldx, ldy)
}

// GroupMMAOK says whether GemvGroupMMA takes the segments (no norm): each
// segment's rows whole 16-byte pieces of K, aligned x rows and weights,
// fp8 segments with scales, 1..MaxGroupSegs segments.
func (k *Set) GroupMMAOK(x cuda.DevPtr, K, ldx, M int, segs []GroupSeg) bool {
	if len(segs) == 0 || len(segs) > MaxGroupSegs {
		return false
	}
	for _, sg := range segs {
		esize := 1
		if sg.BF16 {
			esize = 2
		}
		if !k.MMAOK(x, sg.W, K, ldx, M, esize) || (!sg.BF16 && sg.S == 0) {
			return false
		}
	}
	return true
}

// GemvGroupMMA is GemvGroup (without the norm) on the tensor cores: every
// segment's GEMV of the same M input rows in one launch, 16 rows a block
// (gemv_mma_x.cu; checked and timed on the H200 in session 18). Same results up to float32
// summation order, reproducible run to run.
func (k *Set) GemvGroupMMA(s cuda.Stream, x cuda.DevPtr, K, M, ldx int, segs []GroupSeg) error {
	if K <= 0 || M <= 0 || M > MaxTileM || ldx < K {
		return errors.Newf("gemv group mma: K=%d M=%d ldx=%d (M must be 1..%d, ldx >= K)", K, M, ldx, MaxTileM)
	}
	if !k.GroupMMAOK(x, K, ldx, M, segs) {
		return errors.Newf("gemv group mma: %d segments, K=%d ldx=%d x=%#x: needs 1..%d segments, K*esize %% 16 == 0, ldx %% 4 == 0, aligned x and weights, fp8 scales, sm_80+",
			len(segs), K, ldx, uint64(x), MaxGroupSegs)
	}
	args := make([]any, 0, 4+6*MaxGroupSegs)
	args = append(args, x, ldx, K, M)
	blocks := 0
	for i := range MaxGroupSegs {
		if i >= len(segs) {
			args = append(args, cuda.DevPtr(0), cuda.DevPtr(0), cuda.DevPtr(0), 0, 0, 0)
			continue
		}
		sg := segs[i]
		if sg.N <= 0 || sg.Y == 0 || (M > 1 && sg.LdY < sg.N) {
			return errors.Newf("gemv group mma: segment %d: N=%d LdY=%d Y=%#x (M > 1 needs LdY >= N)", i, sg.N, sg.LdY, uint64(sg.Y))
		}
		if x < sg.Y+cuda.DevPtr(4*((M-1)*sg.LdY+sg.N)) && sg.Y < x+cuda.DevPtr(4*((M-1)*ldx+K)) {
			return errors.Newf("gemv group mma: segment %d's output overlaps the input", i)
		}
		blocks += cdiv(sg.N, 16)
		args = append(args, sg.W, sg.S, sg.Y, sg.N, sg.LdY, b2i(sg.BF16))
	}
	// u4 (four chunks a stage from registers) is the fastest at every row
	// count (session 19, TestKernelMMATiming, 2304 x 7168: 15.9 us at 4 rows
	// against 18.8 for u2, 23.4 for the cp.async `_a` and 34.3 for the tile
	// group kernel; 17.6 / 19.7 / 25.3 / 67.7 at 8). MMAGroupU2 or forceMMAU 2
	// take session 18's u2. The `_a`, `_p` and p2 variants (all slower) were
	// removed in session 19; the code last lives in commit cb41896.
	name := "gemv_mmx_group_u4"
	if forceMMAU == 2 || forceMMAU == 0 && MMAGroupU2 {
		name = "gemv_mmx_group_u2"
	}
	return k.launch(name, cuda.D1(blocks), cuda.D1(256), 0, s, args...)
}
