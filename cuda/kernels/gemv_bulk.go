package kernels

import (
	"github.com/cockroachdb/errors"

	"github.com/tilert-go/tilert/cuda"
)

// Bulk-copy GEMV (cu/wg/gemv_bulk.cu, the sm_90a module; opt-in through
// TILERT_GPU_GEMV_BULK=1 in the engine): the tile GEMV of one input row of
// fp8 weights with the weights streamed by 1-D bulk async copies
// (cp.async.bulk, PTX 8.0, so NVRTC 12+) into a ring of 16 KiB
// shared-memory stages that one producer warp keeps up to bulkStages ahead
// of the 8 consumer warps, in persistent blocks that walk row tiles. For the
// tile kernel's group size G (which the launchers take from tileShape) its
// floats are the tile kernel's bit for bit (same per-thread chunk order,
// same per-chunk fmaf chain and scale, same warp and group reduction; the
// summation order is written out in gemv_bulk.cu), so the emulator's
// transcription of the tile kernel stands for it too.

const (
	gemvBulkName    = "gemv_bulk_fp8"
	gemvBulkThreads = 288   // GB_THREADS: 8 consumer warps + the producer
	gemvBulkStage   = 16384 // GB_STAGE: bytes of one ring stage
	gemvBulkRG      = 4     // GB_RG: weight rows per group
)

// forceBulkG pins the group size (32..256; 0: the tile kernel's) and
// forceBulkB the blocks per SM (1 or 2; 0: 2); tests and timing sweeps.
var forceBulkG, forceBulkB int

// bulkStages is the ring depth for B blocks per SM: 6 stages (96 KiB)
// with two blocks per SM, 12 (192 KiB) with one.
func bulkStages(B int) int { return 12 / B }

// bulkSmem is the dynamic shared memory of a block with nst stages: the
// ring, nst full and nst empty mbarriers, the double-buffered partials.
func bulkSmem(nst int) int { return nst*gemvBulkStage + 16*nst + 2*8*gemvBulkRG*4 }

// bulkGrid is the persistent grid for tiles row tiles and B blocks per SM:
// at most B*sms blocks, every block taking the same number of tiles
// (ceil(tiles / (B*sms))), the last few possibly one fewer.
func bulkGrid(tiles, B, sms int) int {
	per := cdiv(tiles, max(1, B*sms))
	return cdiv(tiles, per)
}

// bulkTiles is the number of row tiles of a launch: output rows per tile
// 256/G*4 (paired 256/G*2) over N rows, times the slots.
func bulkTiles(N, G, nslots int, pair bool) int {
	rout := gemvBulkRG
	if pair {
		rout /= 2
	}
	return cdiv(N, (256/G)*rout) * nslots
}

// bulkG is the launch's group size: the tile kernel's for the same shape
// (so the same bits), or forceBulkG.
func bulkG(sms, N, K, nslots int, pair bool) int {
	if f := forceBulkG; f == 32 || f == 64 || f == 128 || f == 256 {
		return f
	}
	G, _ := tileShape(sms, N, K, 1, nslots, pair)
	return G
}

// BulkOK says whether the bulk GEMV takes the shape: whole 16-byte chunks
// of K, float4-aligned x rows, 16-byte aligned weights (dense; 0 for
// none).
func BulkOK(x cuda.DevPtr, K, ldx int, w ...cuda.DevPtr) bool {
	for _, p := range w {
		if uint64(p)%16 != 0 {
			return false
		}
	}
	return K > 0 && TileOK(x, K, ldx, 1)
}

func (k *Set) bulk(s cuda.Stream, a tileLaunch) error {
	if a.M != 1 {
		return errors.Newf("%s: M=%d: one input row only", gemvBulkName, a.M)
	}
	if a.N <= 0 || a.K <= 0 || a.K%16 != 0 {
		return errors.WithHint(errors.Newf("%s: N=%d K=%d", gemvBulkName, a.N, a.K), "N must be positive and K a positive multiple of 16")
	}
	if a.ldx < a.K || a.ldx%4 != 0 || uint64(a.x)%16 != 0 || a.x == 0 || a.y == 0 {
		return errors.WithHint(errors.Newf("%s: K=%d ldx=%d x=%#x y=%#x", gemvBulkName, a.K, a.ldx, uint64(a.x), uint64(a.y)),
			"x rows need ldx >= K, ldx % 4 == 0 and a 16-byte aligned x; y must be given")
	}
	for _, p := range []cuda.DevPtr{a.w0, a.w1} {
		if uint64(p)%16 != 0 {
			return errors.WithHint(errors.Newf("%s: weights %#x not 16-byte aligned", gemvBulkName, uint64(p)), "bulk copies move 16-byte aligned rows")
		}
	}
	nslots := a.slots + a.dense
	if a.slots < 0 || a.dense < 0 || nslots == 0 || max(1, a.xdiv) <= 0 || a.xsh < 0 {
		return errors.Newf("%s: slots=%d dense=%d xdiv=%d xsh=%d", gemvBulkName, a.slots, a.dense, a.xdiv, a.xsh)
	}
	if a.slots > 0 && (a.t0 == 0 || a.ids == 0) || a.dense > 0 && a.w0 == 0 {
		return errors.Newf("%s: %d routed slots need tables and ids, %d dense slots weights", gemvBulkName, a.slots, a.dense)
	}
	if a.slots > 0 && a.dense > 0 && (a.t1 == 0) != (a.w1 == 0) {
		return errors.Newf("%s: gate-up pairing must hold for routed and dense slots alike", gemvBulkName)
	}
	if nslots > 1 && a.ldy < a.N {
		return errors.Newf("%s: ldy=%d < N=%d", gemvBulkName, a.ldy, a.N)
	}
	pair := a.w1 != 0 || a.t1 != 0
	mod, err := k.wg()
	if err != nil {
		return errors.WithHint(errors.Wrap(err, gemvBulkName), "it needs an H100/H200 (sm_90a) and NVRTC 12+; unset TILERT_GPU_GEMV_BULK to run the tile GEMV")
	}
	f, err := k.c.Function(mod, gemvBulkName)
	if err != nil {
		return err
	}
	B := 2
	if forceBulkB == 1 {
		B = 1
	}
	nst := bulkStages(B)
	sm := bulkSmem(nst)
	if opt := k.c.Info().MaxSharedOptin; opt > 0 && sm > opt {
		return errors.Newf("%s: %d bytes of shared memory a block, the device allows %d", gemvBulkName, sm, opt)
	}
	if _, ok := bigShared.Load(f); !ok {
		if err := k.c.SetMaxDynamicShared(f, bulkSmem(bulkStages(1))); err != nil {
			return errors.WithHint(err, "gemv_bulk_fp8 needs up to ~192 KiB of shared memory a block")
		}
		bigShared.Store(f, true)
	}
	shapeAs := nslots
	if a.shapeSlots > 0 {
		shapeAs = a.shapeSlots
	}
	sms := k.c.Info().SMs
	G := bulkG(sms, a.N, a.K, shapeAs, pair)
	grid := bulkGrid(bulkTiles(a.N, G, nslots, pair), B, sms)
	return k.launchFn(f, cuda.D1(grid), cuda.D1(gemvBulkThreads), sm, s, a.t0, a.ts0, a.t1, a.ts1, a.ids, a.slots,
		a.w0, a.s0, a.w1, a.s1, a.x, a.ldx, max(1, a.xdiv), a.xsh, a.y, a.ldy, a.resid, a.N, a.K, G, nslots, nst)
}

// GemvFP8Bulk is GemvFP8Tile for one input row on the bulk-copy GEMV:
// y[n] = sum_k w[n][k]*scale[n/128][k/128]*x[k] (+ resid[n]; resid may be
// y). The same floats as GemvFP8Tile bit for bit. Needs the sm_90a module,
// K % 16 == 0, ldx-free (one row), 16-byte aligned x and w.
func (k *Set) GemvFP8Bulk(s cuda.Stream, y, x, w, scale, resid cuda.DevPtr, N, K int) error {
	if w == 0 {
		return errors.Newf("%s: no weights", gemvBulkName)
	}
	return k.bulk(s, tileLaunch{w0: w, s0: scale, dense: 1, x: x, ldx: K, y: y, ldy: N, resid: resid, N: N, K: K, M: 1})
}

// GateUpFP8Bulk is GateUpFP8 for one input row on the bulk-copy GEMV.
func (k *Set) GateUpFP8Bulk(s cuda.Stream, y, x, wg, sg, wu, su cuda.DevPtr, N, K int) error {
	if wg == 0 || wu == 0 {
		return errors.Newf("%s gate-up: gate %#x up %#x: both weights needed", gemvBulkName, uint64(wg), uint64(wu))
	}
	return k.bulk(s, tileLaunch{w0: wg, s0: sg, w1: wu, s1: su, dense: 1, x: x, ldx: K, y: y, ldy: N, N: N, K: K, M: 1})
}

// ExpertsFP8Bulk is ExpertsFP8Shaped on the bulk-copy GEMV (the same
// arguments, slots and bits).
func (k *Set) ExpertsFP8Bulk(s cuda.Stream, y, x cuda.DevPtr, ldx, xdiv, xsh int, t, ts [2]cuda.DevPtr, ids cuda.DevPtr, slots int,
	w, ws [2]cuda.DevPtr, dense, N, K, shapeSlots int) error {
	if N <= 0 || K <= 0 || slots < 0 || dense < 0 || slots+dense == 0 || xdiv <= 0 || xsh < 0 || ldx < K {
		return errors.Newf("%s experts: N=%d K=%d slots=%d dense=%d xdiv=%d xsh=%d ldx=%d", gemvBulkName, N, K, slots, dense, xdiv, xsh, ldx)
	}
	return k.bulk(s, tileLaunch{t0: t[0], ts0: ts[0], t1: t[1], ts1: ts[1], ids: ids, slots: slots,
		w0: w[0], s0: ws[0], w1: w[1], s1: ws[1], dense: dense, x: x, ldx: ldx, xdiv: xdiv, xsh: xsh, y: y, ldy: N, N: N, K: K, M: 1,
		shapeSlots: shapeSlots})
}
