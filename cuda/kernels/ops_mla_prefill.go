package kernels

import (
	"github.com/cockroachdb/errors"

	"github.com/tilert-go/tilert/cuda"
)

// Sparse MLA for the many rows of a prefill chunk (cu/mla_tc_prefill.cu):
// mla_decode_tc's arithmetic with 32 heads a block and the queries split
// into their bf16 parts once per block. NOT yet run on a GPU.
const (
	mlaPrefillHeads = 2 * mlaHeadsGroup // MP_HP * MT_HG
	// MLAPrefillSmemBytes is mla_prefill_tc's dynamic shared memory
	// (MP_SMEM_BYTES): raw tile, bf16 tile, 3 bf16 query parts of 32
	// heads, partial scores, token slots, scales.
	MLAPrefillSmemBytes = mlaTCTile*41*16 + mlaTCTile*584*2 + 3*mlaPrefillHeads*584*2 + 2*4*mlaHeadsGroup*mlaTCTile*4 + 3*mlaTCTile*4 + mlaTCTile*4*4
)

var mlaPrefillKernel = mlaTiled{"mla_prefill_tc", "mla prefill", 256, MLAPrefillSmemBytes,
	"mla_prefill_tc needs ~184 KiB of shared memory per block (sm_80 or newer); leave TILERT_GPU_MLA_PREFILL unset",
	mlaTCTile, "", mlaPrefillHeads, false}

// MLAPrefillTC is MLADecodeTC (same arguments, results of the same
// arithmetic) for many query rows: a prefill chunk's rows each attend to
// their own selection (indices row qi, ld ldIdx; -1 and entries at or past
// lens[qi] skipped). nsplit = 1 needs no workspace (the rows fill the
// SMs: nq x H/32 blocks); nsplit > 1 needs ws of MLAWorkspaceBytes(nq, H,
// nsplit) bytes and merges with mla_combine like MLADecodeTC.
func (k *Set) MLAPrefillTC(s cuda.Stream, out, lse, qn, qp, cache, blockTable, indices, lens, ws cuda.DevPtr, nq, H, nidx, ldIdx, nsplit int, scale float32) error {
	if err := mlaPrefillKernel.checkArgs(indices, ws, nq, H, nidx, ldIdx, nsplit); err != nil {
		return errors.WithHint(err, "nq, H and nidx must be positive, ldIdx >= nidx when indices are given, nsplit in range with a workspace past 1")
	}
	if out == 0 || qn == 0 || qp == 0 || cache == 0 || lens == 0 {
		return errors.WithHint(errors.Newf("mla prefill: out %#x qn %#x qp %#x cache %#x lens %#x", uint64(out), uint64(qn), uint64(qp), uint64(cache), uint64(lens)),
			"pass device buffers for the output, the queries, the cache and the row lengths")
	}
	if k.c.Info().CCMajor < 8 {
		return errors.WithHint(errors.Newf("mla prefill: compute capability %d.%d", k.c.Info().CCMajor, k.c.Info().CCMinor),
			"mla_prefill_tc needs sm_80 or newer; leave TILERT_GPU_MLA_PREFILL unset")
	}
	return k.launchMLATiled(mlaPrefillKernel, s, out, lse, qn, qp, cache, blockTable, indices, lens, ws, nq, H, nidx, ldIdx, nsplit, scale)
}

// MLAPrefillTCPSmemBytes is mla_prefill_tcp's dynamic shared memory
// (MPP_SMEM_BYTES): mla_decode_tcp's with partial-score rows of 40 floats.
const MLAPrefillTCPSmemBytes = mlaTCPRaw*mlaTCTile*41*16 + mlaTCTile*584*2 + 4*mlaHeadsGroup*40*4 + (mlaTCPRaw+2)*mlaTCTile*4 + mlaTCTile*4*4

var mlaPrefillTCPKernel = mlaTiled{"mla_prefill_tcp", "mla prefill tcp", 128, MLAPrefillTCPSmemBytes,
	"mla_prefill_tcp needs ~110 KiB of shared memory per block (sm_80 or newer); leave TILERT_GPU_MLA_PREFILL unset",
	mlaTCTile, "", 0, false}

// mlaPrefillTCPIKernel is mla_prefill_tcp with the tile converted by
// integer operations (the same values).
var mlaPrefillTCPIKernel = mlaTiled{"mla_prefill_tcpi", "mla prefill tcp", 128, MLAPrefillTCPSmemBytes,
	"mla_prefill_tcpi needs ~110 KiB of shared memory per block (sm_80 or newer); leave TILERT_GPU_MLA_PREFILL unset",
	mlaTCTile, "", 0, false}

// MLAPrefillTCP is MLAPrefillTC (the same arguments and results) on
// mla_prefill_tcp: mla_decode_tcp's arithmetic (query fragments in
// registers, tiles in flight, ldmatrix fragments) with conflict-free
// partial scores, 16 heads a block, two blocks an SM.
func (k *Set) MLAPrefillTCP(s cuda.Stream, out, lse, qn, qp, cache, blockTable, indices, lens, ws cuda.DevPtr, nq, H, nidx, ldIdx, nsplit int, scale float32) error {
	return k.mlaPrefillTCP(mlaPrefillTCPKernel, s, out, lse, qn, qp, cache, blockTable, indices, lens, ws, nq, H, nidx, ldIdx, nsplit, scale)
}

// MLAPrefillTCPI is MLAPrefillTCP on mla_prefill_tcpi (the entries' fp8
// bytes converted to bf16 by integer operations: the same values).
func (k *Set) MLAPrefillTCPI(s cuda.Stream, out, lse, qn, qp, cache, blockTable, indices, lens, ws cuda.DevPtr, nq, H, nidx, ldIdx, nsplit int, scale float32) error {
	return k.mlaPrefillTCP(mlaPrefillTCPIKernel, s, out, lse, qn, qp, cache, blockTable, indices, lens, ws, nq, H, nidx, ldIdx, nsplit, scale)
}

func (k *Set) mlaPrefillTCP(d mlaTiled, s cuda.Stream, out, lse, qn, qp, cache, blockTable, indices, lens, ws cuda.DevPtr, nq, H, nidx, ldIdx, nsplit int, scale float32) error {
	if err := d.checkArgs(indices, ws, nq, H, nidx, ldIdx, nsplit); err != nil {
		return errors.WithHint(err, "nq, H and nidx must be positive, ldIdx >= nidx when indices are given, nsplit in range with a workspace past 1")
	}
	if out == 0 || qn == 0 || qp == 0 || cache == 0 || lens == 0 {
		return errors.WithHint(errors.Newf("%s: out %#x qn %#x qp %#x cache %#x lens %#x", d.name, uint64(out), uint64(qn), uint64(qp), uint64(cache), uint64(lens)),
			"pass device buffers for the output, the queries, the cache and the row lengths")
	}
	if k.c.Info().CCMajor < 8 {
		return errors.WithHint(errors.Newf("%s: compute capability %d.%d", d.name, k.c.Info().CCMajor, k.c.Info().CCMinor),
			"it needs sm_80 or newer; TILERT_GPU_MLA_PREFILL=0 keeps mla_decode_tc")
	}
	return k.launchMLATiled(d, s, out, lse, qn, qp, cache, blockTable, indices, lens, ws, nq, H, nidx, ldIdx, nsplit, scale)
}

// Sparse MLA for prefill chunks with one fp16 part (cu/mla_tc_prefill_h1.cu):
// 64 heads of one query row a block, queries (scaled per head by a power
// of two), dequantised entries and probabilities rounded once to fp16,
// single mma.sync per product. Serving mode only: ~2^-11 relative
// roundings, not the float32-exact products of the kernels above.
const (
	mlaPrefillH1Tile  = 64 // MH1_T
	mlaPrefillH1Heads = 64 // MH1_HB
	// MLAPrefillH1SmemBytes is mla_prefill_h1's dynamic shared memory
	// (MH1_SMEM_BYTES): raw tile, fp16 tile, fp16 queries, P, row maxima,
	// rescale factors, score factors, row sums, 3 x token slots.
	MLAPrefillH1SmemBytes = mlaPrefillH1Tile*MLATokenBytes + mlaPrefillH1Tile*584*2 + mlaPrefillH1Heads*584*2 +
		mlaPrefillH1Heads*72*2 + 2*mlaPrefillH1Heads*4 + mlaPrefillH1Heads*4 + mlaPrefillH1Heads*4 + 2*mlaPrefillH1Heads*4 + 3*mlaPrefillH1Tile*4
)

var mlaPrefillH1Kernel = mlaTiled{"mla_prefill_h1", "mla prefill h1", 256, MLAPrefillH1SmemBytes,
	"mla_prefill_h1 needs ~199 KiB of shared memory per block (sm_89 or newer); leave TILERT_GPU_MLA_PREFILL unset or below 4",
	mlaPrefillH1Tile, "", mlaPrefillH1Heads, false}

// MLAPrefillH1 is MLAPrefillTC's operation (the same arguments less the
// split: always one range, no workspace) with one fp16 part: for query
// row qi (of nq) and head h, softmax over the row's selected entries
// (indices row qi, ld ldIdx; -1 and entries at or past lens[qi] skipped)
// of scale x (qn.latent + qp.rope), times the latent; out [nq][H][512],
// lse [nq][H] (natural log; optional). Each query row's heads in blocks
// of 64; needs sm_89+ (fp8 -> fp16 conversion in hardware).
func (k *Set) MLAPrefillH1(s cuda.Stream, out, lse, qn, qp, cache, blockTable, indices, lens cuda.DevPtr, nq, H, nidx, ldIdx int, scale float32) error {
	d := mlaPrefillH1Kernel
	if err := d.checkArgs(indices, 0, nq, H, nidx, ldIdx, 1); err != nil || nq > 65535 {
		return errors.WithHint(errors.Newf("%s: nq=%d (1..65535) H=%d nidx=%d ldIdx=%d", d.name, nq, H, nidx, ldIdx),
			"nq, H and nidx must be positive, ldIdx >= nidx when indices are given")
	}
	if out == 0 || qn == 0 || qp == 0 || cache == 0 || lens == 0 {
		return errors.WithHint(errors.Newf("%s: out %#x qn %#x qp %#x cache %#x lens %#x", d.name, uint64(out), uint64(qn), uint64(qp), uint64(cache), uint64(lens)),
			"pass device buffers for the output, the queries, the cache and the row lengths")
	}
	if i := k.c.Info(); i.CCMajor < 8 || (i.CCMajor == 8 && i.CCMinor < 9) {
		return errors.WithHint(errors.Newf("%s: compute capability %d.%d", d.name, i.CCMajor, i.CCMinor),
			"it needs sm_89 or newer (cvt.rn.f16x2.e4m3x2); TILERT_GPU_MLA_PREFILL=2 runs mla_prefill_tcp")
	}
	return k.launchMLATiled(d, s, out, lse, qn, qp, cache, blockTable, indices, lens, 0, nq, H, nidx, ldIdx, 1, scale)
}

// MLAPrefillH1Supported says whether MLAPrefillH1 runs on this device.
func (k *Set) MLAPrefillH1Supported() bool {
	i := k.c.Info()
	return i.CCMajor > 8 || (i.CCMajor == 8 && i.CCMinor >= 9)
}
