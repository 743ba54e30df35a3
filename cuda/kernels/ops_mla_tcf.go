package kernels

import (
	"github.com/cockroachdb/errors"

	"github.com/tilert-go/tilert/cuda"
)

// mla_decode_tcf (cu/mla_tcf.cu): mla_decode_tcp's launch, splits and
// partials with the cache entries fed to the tensor cores as fp16
// straight from the raw tiles (no converted tile in shared memory, two
// barriers a tile instead of three, 4 tiles in flight). Float32-exact
// products as tcp; sums in another order, so float32 rounding apart.

// MLATCFSmemBytes is mla_decode_tcf's dynamic shared memory
// (MTF_SMEM_BYTES): 4 raw tiles, partial scores, 5 x token slots.
const MLATCFSmemBytes = 4*mlaTCTile*41*16 + 4*mlaHeadsGroup*mlaTCTile*4 + 5*mlaTCTile*4 + 4*12*32*4

const mlaTCFHint = "mla_decode_tcf needs sm_90 (fp8 conversions) and ~91 KiB of shared memory per 128 threads"

var mlaTCFKernel = mlaTiled{"mla_decode_tcf", "mla tcf", 128, MLATCFSmemBytes, mlaTCFHint, mlaTCTile, "", 0, true}

// MLATCF8SmemBytes is mla_decode_tcf8's dynamic shared memory
// (MT8_SMEM_BYTES): 4 raw tiles, 8 warps' partial scores, 5 x token slots,
// the RoPE query parts.
const MLATCF8SmemBytes = 4*mlaTCTile*41*16 + 8*mlaHeadsGroup*mlaTCTile*4 + 5*mlaTCTile*4 + 4*12*32*4

// mlaTCF8Kernel is mla_decode_tcf with 8 warps per head group (64 latent
// dims and output columns a warp, <= 128 registers: two blocks of 8 warps
// an SM), split + combine.
var mlaTCF8Kernel = mlaTiled{"mla_decode_tcf8", "mla tcf8", 256, MLATCF8SmemBytes, mlaTCFHint, mlaTCTile, "", 0, true}

// mlaTCF2Kernel: mla_decode_tcf with two fp16 parts of the queries and
// probabilities (a third fewer mma; products ~2^-22 relative, not
// float32-exact), split + combine.
var mlaTCF2Kernel = mlaTiled{"mla_decode_tcf2", "mla tcf2", 128, MLATCFSmemBytes, mlaTCFHint, mlaTCTile, "", 0, true}

func (k *Set) needSM90(what string) error {
	if i := k.c.Info(); i.CCMajor < 9 {
		return errors.WithHint(errors.Newf("%s: compute capability %d.%d", what, i.CCMajor, i.CCMinor),
			"mla_decode_tcf needs sm_90; use MLADecodeTCP")
	}
	return nil
}

// MLATCF picks a split variant of mla_decode_tcf.
type MLATCF int

const (
	// MLATCF2: two fp16 parts of the queries and probabilities (hi, then
	// the rounded rest: ~23 bits, within float32 rounding of three parts
	// on the H200 checks); the engine's default.
	MLATCF2 MLATCF = iota
	// MLATCF3: three fp16 parts (float32-exact products).
	MLATCF3
	// MLATCF8: two parts, 8 warps per head group (two blocks of 8 warps
	// an SM).
	MLATCF8
)

func (v MLATCF) kernel() mlaTiled {
	switch v {
	case MLATCF3:
		return mlaTCFKernel
	case MLATCF8:
		return mlaTCF8Kernel
	}
	return mlaTCF2Kernel
}

// MLADecodeTCF is MLADecodeTCP (same arguments and results to float32
// rounding) on the mla_decode_tcf variant v. Split as MLATCSplits plans
// (two blocks per SM); nsplit > 1 needs ws of MLAWorkspaceBytes(nq, H,
// nsplit) bytes. rowBase != 0: rows of different caches (slots) in one
// launch, row r's entries at rowBase[r] + cache (cache then the layer's
// offset in every slot's region; no block table), as MLADecodeTCPRows.
func (k *Set) MLADecodeTCF(s cuda.Stream, v MLATCF, out, lse, qn, qp, cache, blockTable, rowBase, indices, lens, ws cuda.DevPtr, nq, H, nidx, ldIdx, nsplit int, scale float32) error {
	d := v.kernel()
	if err := d.checkArgs(indices, ws, nq, H, nidx, ldIdx, nsplit); err != nil {
		return err
	}
	if err := k.needSM90("mla tcf"); err != nil {
		return err
	}
	if rowBase != 0 && blockTable != 0 {
		return errors.New("mla tcf: per-row cache bases take no block table")
	}
	return k.launchMLATiledRows(d, s, out, lse, qn, qp, cache, blockTable, indices, lens, ws, rowBase, nq, H, nidx, ldIdx, nsplit, scale, true, true)
}
