package kernels

import (
	"os"
	"sync"

	"github.com/cockroachdb/errors"

	"github.com/tilert-go/tilert/cuda"
)

// Heads-as-M MLA decode (cu/mla_heads.cu): mla_decode's semantics, each
// cache entry read once per block of 16 heads instead of once per head.
const (
	mlaHeadsGroup  = 16  // MH_HG
	mlaHeadsTile   = 32  // MH_TC
	mlaHeadsSplits = 128 // most token ranges one call splits into
	// MLAHeadsSmemBytes is mla_decode_heads' dynamic shared memory
	// (MH_SMEM_FLOATS floats).
	MLAHeadsSmemBytes = 4 * (mlaHeadsGroup*576 + mlaHeadsTile*580 + 8*mlaHeadsGroup*mlaHeadsTile + mlaHeadsTile*mlaHeadsGroup + 3*mlaHeadsGroup + mlaHeadsTile)
)

// bigShared remembers the functions whose shared-memory limit was raised
// (an attribute of the loaded function, set once per context).
var bigShared sync.Map

// mlaHeadsMaxSMs caps the SM count MLAHeadsSplits plans for, so that
// MLAHeadsWorkspaceBytes can bound the scratch without a device.
const mlaHeadsMaxSMs = 256

func mlaHeadsSplitsFor(sms, nq, H, nidx int) int {
	return mlaSplitsFor(sms, nq, H, nidx, mlaHeadsGroup, mlaHeadsTile, mlaHeadsSplits)
}

// mlaSplitsFor: the token ranges of a split MLA decode whose blocks (query
// rows x groups of group heads x ranges) fill sms SMs once, whole tiles of
// tile tokens a range, at most most ranges.
func mlaSplitsFor(sms, nq, H, nidx, group, tile, most int) int {
	blocks := max(1, nq*cdiv(H, group)) // H = 0: a tensor-parallel rank without heads
	want := cdiv(min(max(1, sms), mlaHeadsMaxSMs), blocks)
	return max(1, min(want, cdiv(nidx, tile), most))
}

// mlaWorkspaceFor bounds the partials of splits(nq) ranges for any nq <=
// maxRows (splits planned for mlaHeadsMaxSMs and any nidx).
func mlaWorkspaceFor(maxRows, H int, splits func(sms, nq, H, nidx int) int) int64 {
	var most int64
	for nq := 1; nq <= maxRows; nq++ {
		most = max(most, MLAWorkspaceBytes(nq, H, splits(mlaHeadsMaxSMs, nq, H, 1<<30)))
	}
	return most
}

// MLAHeadsSplits picks how many token ranges MLADecodeHeads splits nidx
// tokens into so that the blocks (head groups x query rows x ranges) fill
// the SMs once (one block per SM fits its shared memory); whole 32-token
// tiles per range.
func (k *Set) MLAHeadsSplits(nq, H, nidx int) int {
	return mlaHeadsSplitsFor(k.c.Info().SMs, nq, H, nidx)
}

// MLAHeadsWorkspaceBytes bounds the scratch MLADecodeHeads needs with the
// splits of MLAHeadsSplits for any nq <= maxRows, any nidx and any device.
func MLAHeadsWorkspaceBytes(maxRows, H int) int64 {
	return mlaWorkspaceFor(maxRows, H, mlaHeadsSplitsFor)
}

// MLADecodeHeads is MLADecode (same arguments and results) computed with
// the heads as the rows of small matrix products over each 32-token tile of
// the cache, dequantised once into shared memory. nsplit > 1 needs ws of
// MLAWorkspaceBytes(nq, H, nsplit) bytes; mla_combine_wide merges the ranges.
func (k *Set) MLADecodeHeads(s cuda.Stream, out, lse, qn, qp, cache, blockTable, indices, lens, ws cuda.DevPtr, nq, H, nidx, ldIdx, nsplit int, scale float32) error {
	if err := mlaHeadsKernel.checkArgs(indices, ws, nq, H, nidx, ldIdx, nsplit); err != nil {
		return err
	}
	return k.launchMLATiled(mlaHeadsKernel, s, out, lse, qn, qp, cache, blockTable, indices, lens, ws, nq, H, nidx, ldIdx, nsplit, scale)
}

// mlaTiled is a decode kernel of the heads-as-M family (mla_decode_heads,
// mla_decode_tc): blocks of mlaHeadsGroup heads x query rows x token ranges
// of whole tiles, with the launch arguments of mla_decode_heads and the
// ranges merged by mla_combine_wide.
type mlaTiled struct {
	name    string // the kernel
	what    string // in argument errors
	threads int
	smem    int    // dynamic shared memory, its limit raised once per function
	hint    string // when that limit cannot be raised
	tile    int    // tokens a range is a multiple of
	combine string // the merge of the ranges ("": mlaCombineFor's pick)
	group   int    // heads a block (0: mlaHeadsGroup)
	rows    bool   // takes a last argument of per-row cache bases (mla_decode_tcp)
}

var (
	mlaHeadsKernel = mlaTiled{"mla_decode_heads", "mla heads", 256, MLAHeadsSmemBytes,
		"mla_decode_heads needs ~127 KiB of shared memory per block (sm_80 or newer)", mlaHeadsTile, "", 0, false}
	mlaTCKernel = mlaTiled{"mla_decode_tc", "mla tc", 128, MLATCSmemBytes,
		"mla_decode_tc needs ~103 KiB of shared memory per block (sm_80 or newer)", mlaTCTile, "", 0, false}
	// mlaTCPKernel is mla_decode_tc (the same bits) with the query
	// fragments split once into registers, MTP_NR tiles in flight and the
	// P.V fragments by ldmatrix.trans: a shorter chain per tile.
	mlaTCPKernel = mlaTiled{"mla_decode_tcp", "mla tcp", 128, MLATCPSmemBytes,
		"mla_decode_tcp needs ~108 KiB of shared memory per block (sm_80 or newer)", mlaTCTile, "", 0, true}
)

func (d mlaTiled) checkArgs(indices, ws cuda.DevPtr, nq, H, nidx, ldIdx, nsplit int) error {
	if nq <= 0 || H <= 0 || nidx <= 0 || (indices != 0 && ldIdx < nidx) || nsplit <= 0 || nsplit > mlaHeadsSplits || (nsplit > 1 && ws == 0) {
		return errors.Newf("%s: nq=%d H=%d nidx=%d ldIdx=%d nsplit=%d (1..%d) ws=%#x", d.what, nq, H, nidx, ldIdx, nsplit, mlaHeadsSplits, uint64(ws))
	}
	return nil
}

// mlaCombineFor picks the merge of the split partials for blocks (query
// row, head) blocks: mla_combine_wide issues its first 32 partials' loads
// before the weights but needs 163 registers (3 blocks per SM), so it wins
// while the blocks fit one such wave (H200, graph-timed: 3.56 vs 4.98 us at
// 128 blocks x 32 splits); past that mla_combine_wide_v1 (64 registers)
// does (3.46 vs 5.07 us at 512 x 8). The same sums in the same order.
func mlaCombineFor(sms, blocks int) string {
	if blocks <= 3*max(1, sms) {
		return "mla_combine_wide"
	}
	return "mla_combine_wide_v1"
}

// launchMLATiled launches d on arguments d.checkArgs accepted.
func (k *Set) launchMLATiled(d mlaTiled, s cuda.Stream, out, lse, qn, qp, cache, blockTable, indices, lens, ws cuda.DevPtr, nq, H, nidx, ldIdx, nsplit int, scale float32) error {
	return k.launchMLATiledParts(d, s, out, lse, qn, qp, cache, blockTable, indices, lens, ws, nq, H, nidx, ldIdx, nsplit, scale, true, true)
}

// launchMLATiledParts launches the decode kernel (decode) and the combine
// (combine) of launchMLATiled; the timing tests time them apart.
func (k *Set) launchMLATiledParts(d mlaTiled, s cuda.Stream, out, lse, qn, qp, cache, blockTable, indices, lens, ws cuda.DevPtr, nq, H, nidx, ldIdx, nsplit int, scale float32, decode, combine bool) error {
	return k.launchMLATiledRows(d, s, out, lse, qn, qp, cache, blockTable, indices, lens, ws, 0, nq, H, nidx, ldIdx, nsplit, scale, decode, combine)
}

// launchMLATiledRows is launchMLATiledParts with per-row cache bases
// (rowBase != 0: d.rows kernels only).
func (k *Set) launchMLATiledRows(d mlaTiled, s cuda.Stream, out, lse, qn, qp, cache, blockTable, indices, lens, ws, rowBase cuda.DevPtr, nq, H, nidx, ldIdx, nsplit int, scale float32, decode, combine bool) error {
	if rowBase != 0 && !d.rows {
		return errors.Newf("%s: no per-row cache bases", d.name)
	}
	f, err := k.fn(d.name)
	if err != nil {
		return err
	}
	if _, ok := bigShared.Load(f); !ok {
		if err := k.c.SetMaxDynamicShared(f, d.smem); err != nil {
			return errors.WithHint(err, d.hint)
		}
		bigShared.Store(f, true)
	}
	tps := cdiv(cdiv(nidx, nsplit), d.tile) * d.tile
	nsplit = cdiv(nidx, tps)
	partO, partML := ws, ws.Add(int64(nq*H*nsplit)*MLALatentDim*4)
	if decode {
		group := d.group
		if group == 0 {
			group = mlaHeadsGroup
		}
		args := []any{qn, qp, cache, blockTable, indices, ldIdx, nidx, lens, out, lse, H, scale, tps, partO, partML}
		if d.rows {
			args = append(args, rowBase)
		}
		if err := k.launchFn(f, cuda.D3(nsplit, nq, cdiv(H, group)), cuda.D1(d.threads), d.smem, s, args...); err != nil {
			return err
		}
	}
	if nsplit == 1 || !combine {
		return nil
	}
	if ws == 0 {
		return errors.Newf("%s: %d splits need the workspace", d.name, nsplit)
	}
	comb := d.combine
	if comb == "" {
		comb = mlaCombineFor(k.c.Info().SMs, nq*H)
	}
	if d.rows && mlaCombinePDL && k.c.PDLSupported() {
		// The combine's blocks are scheduled while the decode drains (its
		// griddepcontrol.wait holds them until the partials are written):
		// the launch gap between the two leaves the chain.
		f, err := k.fn(comb)
		if err != nil {
			return err
		}
		return k.c.LaunchWith(f, cuda.D1(nq*H), cuda.D1(128), 0, s, cuda.LaunchOpts{PDL: true, Priority: k.prio}, partO, partML, nsplit, out, lse)
	}
	return k.launch(comb, cuda.D1(nq*H), cuda.D1(128), 0, s, partO, partML, nsplit, out, lse)
}

// mlaCombinePDL: TILERT_GPU_MLA_COMBINE_PDL=1 launches the combine after
// mla_decode_tcp programmatically (whatever TILERT_GPU_PDL says; both
// kernels begin with PDL_WAIT).
var mlaCombinePDL = os.Getenv("TILERT_GPU_MLA_COMBINE_PDL") == "1"

// Tensor-core MLA decode (cu/mla_tc.cu): mla_decode's semantics, 16 heads a
// block, each 32-token tile converted once into shared memory as bf16 (fp8
// values exact, scales kept apart in float32) and both products on
// mma.sync with the queries and probabilities split into bf16 hi + lo.
const (
	mlaTCTile = 32 // MT_TT
	// MLATCSmemBytes is mla_decode_tc's dynamic shared memory (MT_SMEM_BYTES).
	MLATCSmemBytes = mlaTCTile*41*16 + mlaTCTile*584*2 + mlaHeadsGroup*584*4 + 4*mlaHeadsGroup*mlaTCTile*4 + 3*mlaTCTile*4 + mlaTCTile*4*4
	// mlaTCPRaw is mla_decode_tcp's raw tile buffers (MTP_NR).
	mlaTCPRaw = 3
	// MLATCPSmemBytes is mla_decode_tcp's (MTP_SMEM_BYTES).
	MLATCPSmemBytes = mlaTCPRaw*mlaTCTile*41*16 + mlaTCTile*584*2 + 4*mlaHeadsGroup*mlaTCTile*4 + (mlaTCPRaw+2)*mlaTCTile*4 + mlaTCTile*4*4
)

// MLATCSplits picks MLADecodeTC's token ranges: two blocks per SM fit its
// shared memory, so the blocks fill the SMs twice; the plan stays inside
// MLAHeadsWorkspaceBytes (the SM count it plans for is capped the same way).
func (k *Set) MLATCSplits(nq, H, nidx int) int {
	return mlaHeadsSplitsFor(2*k.c.Info().SMs, nq, H, nidx)
}

// MLADecodeTC is MLADecode over the fp8_ds_mla cache (same arguments and
// results) on tensor cores. nsplit > 1 needs ws of MLAWorkspaceBytes(nq, H,
// nsplit) bytes; mla_combine_wide merges the ranges.
func (k *Set) MLADecodeTC(s cuda.Stream, out, lse, qn, qp, cache, blockTable, indices, lens, ws cuda.DevPtr, nq, H, nidx, ldIdx, nsplit int, scale float32) error {
	if err := mlaTCKernel.checkArgs(indices, ws, nq, H, nidx, ldIdx, nsplit); err != nil {
		return err
	}
	if k.c.Info().CCMajor < 8 {
		return errors.WithHint(errors.Newf("mla tc: compute capability %d.%d", k.c.Info().CCMajor, k.c.Info().CCMinor),
			"mla_decode_tc needs sm_80 or newer; use MLADecodeHeads")
	}
	return k.launchMLATiled(mlaTCKernel, s, out, lse, qn, qp, cache, blockTable, indices, lens, ws, nq, H, nidx, ldIdx, nsplit, scale)
}

// MLADecodeTCP is MLADecodeTC (same arguments, the same bits) with a
// shorter chain per tile (mla_decode_tcp). Split as MLATCSplits plans.
func (k *Set) MLADecodeTCP(s cuda.Stream, out, lse, qn, qp, cache, blockTable, indices, lens, ws cuda.DevPtr, nq, H, nidx, ldIdx, nsplit int, scale float32) error {
	if err := mlaTCPKernel.checkArgs(indices, ws, nq, H, nidx, ldIdx, nsplit); err != nil {
		return err
	}
	if k.c.Info().CCMajor < 8 {
		return errors.WithHint(errors.Newf("mla tcp: compute capability %d.%d", k.c.Info().CCMajor, k.c.Info().CCMinor),
			"mla_decode_tcp needs sm_80 or newer; use MLADecodeHeads")
	}
	return k.launchMLATiled(mlaTCPKernel, s, out, lse, qn, qp, cache, blockTable, indices, lens, ws, nq, H, nidx, ldIdx, nsplit, scale)
}

// MLADecodeTCPRows is MLADecodeTCP over rows of different caches (slots)
// in one launch: row r's entries start at rowBase[r] + cacheOff (rowBase:
// nq int64 in device memory; cacheOff the layer's offset in every slot's
// region); no block table.
func (k *Set) MLADecodeTCPRows(s cuda.Stream, out, lse, qn, qp cuda.DevPtr, cacheOff int64, rowBase, indices, lens, ws cuda.DevPtr, nq, H, nidx, ldIdx, nsplit int, scale float32) error {
	if err := mlaTCPKernel.checkArgs(indices, ws, nq, H, nidx, ldIdx, nsplit); err != nil {
		return err
	}
	if rowBase == 0 || k.c.Info().CCMajor < 8 {
		return errors.WithHint(errors.Newf("mla tcp rows: row bases %#x, compute capability %d.%d", uint64(rowBase), k.c.Info().CCMajor, k.c.Info().CCMinor),
			"one launch per slot (TILERT_GPU_SLOT_MERGE=0) on devices below sm_80")
	}
	return k.launchMLATiledRows(mlaTCPKernel, s, out, lse, qn, qp, cuda.DevPtr(cacheOff), 0, indices, lens, ws, rowBase, nq, H, nidx, ldIdx, nsplit, scale, true, true)
}

// absorbCols picks absorb_q_fp8's columns per block (16*G): the widest that
// still gives every SM a block.
func absorbCols(sms, H, R int) int {
	for _, g := range []int{8, 4} {
		if R%(16*g) == 0 && H*(R/(16*g)) >= sms {
			return g
		}
	}
	return 2
}

// absorbRows picks absorb_v_fp8's rows per warp: the most that still give
// every SM a block.
func absorbRows(sms, H, vd int) int {
	for _, rw := range []int{4, 2} {
		if H*cdiv(vd, 8*rw) >= sms {
			return rw
		}
	}
	return 1
}

// QRope is the rotation AbsorbQFP8 applies to the RoPE part it copies out
// (Rope's semantics with one position per query row: Pos int32 [M], tables
// [position][P/2]); the zero value copies without rotating.
type QRope struct {
	Pos, Cos, Sin cuda.DevPtr
	Interleaved   bool
}

// AbsorbQFP8 is EngAbsorbQ over fp8 W_UK with per-row scales, spread over
// all SMs (R a multiple of 32, nope <= 256); qpe != 0 also receives the
// RoPE part of q, qpe[m][h][i] = q[m*ldq + h*hs + nope + i] (i < P, P
// even), rotated by rope.
func (k *Set) AbsorbQFP8(s cuda.Stream, out, qpe, q, w, scale cuda.DevPtr, M, H, nope, R, ldq, hs, P int, rope QRope) error {
	if M <= 0 || H <= 0 || nope <= 0 || nope > 256 || R <= 0 || R%32 != 0 || hs < nope || ldq < (H-1)*hs+nope || (qpe != 0 && (P <= 0 || P%2 != 0 || hs < nope+P)) {
		return errors.Newf("absorb q fp8: M=%d H=%d nope=%d (<= 256) R=%d (multiple of 32) ldq=%d hs=%d P=%d (even)", M, H, nope, R, ldq, hs, P)
	}
	return k.absorbQFP8(s, out, qpe, q, w, scale, M, H, nope, R, ldq, hs, P, rope, absorbCols(k.c.Info().SMs, H, R))
}

// absorbQFP8 launches absorb_q_fp8 with 16*g columns per block (g in 2, 4, 8).
func (k *Set) absorbQFP8(s cuda.Stream, out, qpe, q, w, scale cuda.DevPtr, M, H, nope, R, ldq, hs, P int, rope QRope, g int) error {
	if R%(16*g) != 0 || nope > 8*256/g {
		return errors.Newf("absorb q fp8: R=%d nope=%d with %d columns a block", R, nope, 16*g)
	}
	name := "absorb_q_fp8"
	if nope <= 4*256/g {
		name = "absorb_q_fp8_r4" // 4 rows a thread: fewer registers, more blocks resident
	}
	return k.launch(name, cuda.D1(H*(R/(16*g))), cuda.D1(256), 0, s, out, qpe, q, w, scale, M, H, nope, R, ldq, hs, g, P,
		rope.Pos, rope.Cos, rope.Sin, b2i(rope.Interleaved))
}

// AbsorbVFP8 is EngAbsorbV over fp8 W_UV with per-row scales (R = 512),
// spread over all SMs.
func (k *Set) AbsorbVFP8(s cuda.Stream, out, x, w, scale cuda.DevPtr, M, H, vd, R, ldo int) error {
	if M <= 0 || H <= 0 || vd <= 0 || R != MLALatentDim || ldo < H*vd {
		return errors.Newf("absorb v fp8: M=%d H=%d vd=%d R=%d (must be %d) ldo=%d", M, H, vd, R, MLALatentDim, ldo)
	}
	return k.absorbVFP8(s, out, x, w, scale, M, H, vd, ldo, absorbRows(k.c.Info().SMs, H, vd))
}

// absorbVFP8 launches absorb_v_fp8 with rw rows a warp (1, 2 or 4).
func (k *Set) absorbVFP8(s cuda.Stream, out, x, w, scale cuda.DevPtr, M, H, vd, ldo, rw int) error {
	return k.launch("absorb_v_fp8", cuda.D1(H*cdiv(vd, 8*rw)), cuda.D1(256), 0, s, out, x, w, scale, M, H, vd, ldo, rw)
}
