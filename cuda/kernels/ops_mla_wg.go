package kernels

import (
	"sync/atomic"

	"github.com/cockroachdb/errors"

	"github.com/tilert-go/tilert/cuda"
)

// mla_prefill_wg (cu/wg/mla_prefill_wg.cu, the sm_90a module): MLAPrefillH1's
// operation and roundings with its products on wgmma.mma_async.
const (
	// MLAPrefillWGSmemBytes is mla_prefill_wg's dynamic shared memory
	// (MWG_SMEM_BYTES): raw tile, fp16 tile and queries (72 x 8 core
	// matrices of 128 bytes each), P (8 x 8), row maxima, rescale factors,
	// score factors, row sums, 3 x token slots.
	MLAPrefillWGSmemBytes = mlaPrefillH1Tile*MLATokenBytes + 2*72*8*128 + 8*8*128 +
		2*mlaPrefillH1Heads*4 + mlaPrefillH1Heads*4 + mlaPrefillH1Heads*4 + 2*mlaPrefillH1Heads*4 + 3*mlaPrefillH1Tile*4
	mlaPrefillWGName = "mla_prefill_wg"
)

// MLAPrefillWG is MLAPrefillH1 (the same arguments, checks and results up
// to float32 summation order) on mla_prefill_wg: Hopper's warpgroup MMA,
// compute capability 9.0 with an NVRTC that builds sm_90a (WGSupported).
func (k *Set) MLAPrefillWG(s cuda.Stream, out, lse, qn, qp, cache, blockTable, indices, lens cuda.DevPtr, nq, H, nidx, ldIdx int, scale float32) error {
	d := mlaPrefillH1Kernel
	if err := d.checkArgs(indices, 0, nq, H, nidx, ldIdx, 1); err != nil || nq > 65535 {
		return errors.WithHint(errors.Newf("%s: nq=%d (1..65535) H=%d nidx=%d ldIdx=%d", mlaPrefillWGName, nq, H, nidx, ldIdx),
			"nq, H and nidx must be positive, ldIdx >= nidx when indices are given")
	}
	if out == 0 || qn == 0 || qp == 0 || cache == 0 || lens == 0 {
		return errors.WithHint(errors.Newf("%s: out %#x qn %#x qp %#x cache %#x lens %#x", mlaPrefillWGName, uint64(out), uint64(qn), uint64(qp), uint64(cache), uint64(lens)),
			"pass device buffers for the output, the queries, the cache and the row lengths")
	}
	mod, err := k.wg()
	if err != nil {
		return errors.WithHint(errors.Wrap(err, mlaPrefillWGName), "it needs an H100/H200 (sm_90a) and NVRTC 12+; TILERT_GPU_MLA_PREFILL=4 runs mla_prefill_h1")
	}
	f, err := k.c.Function(mod, mlaPrefillWGName)
	if err != nil {
		return err
	}
	if _, ok := bigShared.Load(f); !ok {
		if err := k.c.SetMaxDynamicShared(f, MLAPrefillWGSmemBytes); err != nil {
			return errors.WithHint(err, "mla_prefill_wg needs ~195 KiB of shared memory per block")
		}
		bigShared.Store(f, true)
	}
	tps := cdiv(nidx, mlaPrefillH1Tile) * mlaPrefillH1Tile
	return k.launchFn(f, cuda.D3(1, nq, cdiv(H, mlaPrefillH1Heads)), cuda.D1(256), MLAPrefillWGSmemBytes, s,
		qn, qp, cache, blockTable, indices, ldIdx, nidx, lens, out, lse, H, scale, tps, cuda.DevPtr(0), cuda.DevPtr(0))
}

// mla_prefill_wg2 (cu/wg/mla_prefill_wg2.cu, the sm_90a module):
// mla_prefill_wg's block with a producer warpgroup that gathers and
// converts the next tile into a second fp16 stage while the two consumer
// warpgroups run this tile's MMAs and softmax.
const (
	// MLAPrefillWG2SmemBytes is mla_prefill_wg2's dynamic shared memory
	// (MW2_SMEM_BYTES): two fp16 stages and the queries (72 x 8 core
	// matrices of 128 bytes each), P (8 x 8), row maxima, rescale factors,
	// score factors, row sums, 2 x token slots, 2 done flags.
	MLAPrefillWG2SmemBytes = 3*72*8*128 + 8*8*128 +
		2*mlaPrefillH1Heads*4 + mlaPrefillH1Heads*4 + mlaPrefillH1Heads*4 + 2*mlaPrefillH1Heads*4 + 2*mlaPrefillH1Tile*4 + 2*4
	mlaPrefillWG2Name = "mla_prefill_wg2"
	// mlaPrefillWG2Threads: two consumer warpgroups and the producer.
	mlaPrefillWG2Threads = 384
)

// MLAPrefillWG2 is MLAPrefillWG (the same arguments, checks and results:
// the consumers' arithmetic is mla_prefill_wg's, instruction for
// instruction) on mla_prefill_wg2.
func (k *Set) MLAPrefillWG2(s cuda.Stream, out, lse, qn, qp, cache, blockTable, indices, lens cuda.DevPtr, nq, H, nidx, ldIdx int, scale float32) error {
	d := mlaPrefillH1Kernel
	if err := d.checkArgs(indices, 0, nq, H, nidx, ldIdx, 1); err != nil || nq > 65535 {
		return errors.WithHint(errors.Newf("%s: nq=%d (1..65535) H=%d nidx=%d ldIdx=%d", mlaPrefillWG2Name, nq, H, nidx, ldIdx),
			"nq, H and nidx must be positive, ldIdx >= nidx when indices are given")
	}
	if out == 0 || qn == 0 || qp == 0 || cache == 0 || lens == 0 {
		return errors.WithHint(errors.Newf("%s: out %#x qn %#x qp %#x cache %#x lens %#x", mlaPrefillWG2Name, uint64(out), uint64(qn), uint64(qp), uint64(cache), uint64(lens)),
			"pass device buffers for the output, the queries, the cache and the row lengths")
	}
	mod, err := k.wg()
	if err != nil {
		return errors.WithHint(errors.Wrap(err, mlaPrefillWG2Name), "it needs an H100/H200 (sm_90a) and NVRTC 12+; TILERT_GPU_MLA_PREFILL=4 runs mla_prefill_h1")
	}
	f, err := k.c.Function(mod, mlaPrefillWG2Name)
	if err != nil {
		return err
	}
	if _, ok := bigShared.Load(f); !ok {
		if err := k.c.SetMaxDynamicShared(f, MLAPrefillWG2SmemBytes); err != nil {
			return errors.WithHint(err, "mla_prefill_wg2 needs 231,432 bytes (226 KiB) of shared memory per block")
		}
		bigShared.Store(f, true)
	}
	tps := cdiv(nidx, mlaPrefillH1Tile) * mlaPrefillH1Tile
	return k.launchFn(f, cuda.D3(1, nq, cdiv(H, mlaPrefillH1Heads)), cuda.D1(mlaPrefillWG2Threads), MLAPrefillWG2SmemBytes, s,
		qn, qp, cache, blockTable, indices, ldIdx, nidx, lens, out, lse, H, scale, tps, cuda.DevPtr(0), cuda.DevPtr(0))
}

// mla_decode_wg2 (cu/wg/mla_prefill_wg2.cu, the sm_90a module): the decode
// step's sparse MLA on mla_prefill_wg2's block (64 heads x one query row a
// block, the products on wgmma with one fp16 part, a producer warpgroup
// gathering and converting the next 64-token tile), the selections split
// over the SMs (one block an SM: 226 KiB of shared memory) and merged by
// mla_combine. The engine's default for 64 heads or more
// (engine/gpu mlaWGRule; TILERT_GPU_MLA_WG=0 goes back to mla_decode_tcf2).
const (
	mlaDecodeWG2Name  = "mla_decode_wg2"
	mlaDecodeWG2BName = "mla_decode_wg2b"
	mlaDecodeWG2HName = "mla_decode_wg2h" // 32 heads a block (MLAHeadsPerBlock)
	mlaWG2MaxSplits   = 32                // a 2048-token selection in one-tile ranges
)

// MLAWG2B makes MLADecodeWG2 launch mla_decode_wg2b where each block
// takes one 64-token tile and the launch holds at most
// mlaWG2BMaxHeadBlocks rows x head blocks (one row of 128 heads):
// mla_decode_wg2's arithmetic, so the same bits, with shorter latency
// chains where the session 20 profile (ncu, one row of 128 heads) found
// the block's time: the queries' loads four heads a round instead of two,
// the tile's gather in one cp.async round trip instead of three, the split
// partial stored as whole 2 KB rows through shared memory, and a
// programmatic launch. H200, session 20 call B0, graph-timed decode +
// combine: 1 x 128 heads 16.63 -> 16.06 us; 4 x 128 (two tiles a block)
// 26.32 -> 28.78. In the step (session 21, docs/measured/h200-2026-12-03-s21)
// it gains at one row of 128 heads (DeepSeek-V3.2 dims, 8192: 2.656 ->
// 2.648 ms) but loses wherever the grid is 128 one-tile blocks, although
// it was faster there graph-timed alone: GLM-5 4 slots (4 x 64 heads)
// 5.366 -> 5.547 ms, the DeepSeek-V3.2 MTP step (2 x 128) 4.875 -> 5.018,
// the same with a plain launch, so the kernel and not its launch. The
// engine clears it with TILERT_GPU_MLA_WG2B=0.
var MLAWG2B = true

// mlaWG2BMaxHeadBlocks is the most rows x 64-head blocks a launch of
// mla_decode_wg2b holds (see MLAWG2B).
const mlaWG2BMaxHeadBlocks = 2

// MLAHeadsPerBlock (32; 64: none; 0, the default: 32 for one row of 64
// heads, none elsewhere, see wg2hAuto) makes MLADecodeWG2 launch
// mla_decode_wg2h (32 heads a block) where each block takes one 64-token
// tile and the launch holds at most mlaWG2HMaxHeadBlocks rows x 32-head
// blocks (one row of 128 heads, up to two of 64): mla_decode_wg2b's bits on
// twice the blocks, each loading half the queries and storing half the
// partial rows (16 heads a block, mla_decode_wg2q, measured slower in
// session 38 and removed). Session 20's ncu profile of the one-tile block
// (docs/measured/h200-2026-12-03-s20 callA) put ~40% of its stalls in the
// queries' prologue and ~25% in the partial's stores, the MMAs ~12%; in the
// step the sparse MLA runs 12.5 us on 64 blocks (DeepSeek-V3.2 dims) and
// 12.2 on 32 (GLM-5), on the critical path. The engine sets it with
// TILERT_GPU_MLA_HEADS.
var MLAHeadsPerBlock int

// wg2hAuto is MLAHeadsPerBlock 0's heads a block for nq rows of H heads:
// 32 for one row of 64 (session 38, H100, 3 MoE layers, A/B/A/B at 8192:
// GLM-5 dims -5 / -5 us a step alone, -10 / -18 with topk_radix_one_w12;
// DeepSeek-V3.2's one row of 128 heads +33 / +37 us, so not there; two rows
// (GLM-5's MTP step) not measured).
func wg2hAuto(nq, H int) int {
	if nq == 1 && H == 64 {
		return 32
	}
	return 64
}

// MLAWG2HLaunches counts mla_decode_wg2h launches (tests).
var MLAWG2HLaunches atomic.Int64

// mlaWG2HMaxHeadBlocks: the most rows x 32-head blocks a launch of
// mla_decode_wg2h holds (with 32 one-tile ranges: 128 blocks).
const mlaWG2HMaxHeadBlocks = 4

// wg2hKernel is the kernel MLADecodeWG2 launches for nq rows of H heads in
// ranges of tps tokens under MLAHeadsPerBlock, and its heads a block ("": the
// 64-head kernels).
func wg2hKernel(nq, H, tps int) (string, int) {
	hpb := MLAHeadsPerBlock
	if hpb == 0 {
		hpb = wg2hAuto(nq, H)
	}
	if hpb != 32 || !MLAWG2B || tps != mlaPrefillH1Tile || nq*cdiv(H, hpb) > mlaWG2HMaxHeadBlocks {
		return "", 0
	}
	return mlaDecodeWG2HName, 32
}

// wg2Kernel is the kernel MLADecodeWG2 launches for nq rows of H heads in
// ranges of tps tokens, and its heads a block.
func wg2Kernel(nq, H, tps int) (string, int) {
	if n, h := wg2hKernel(nq, H, tps); n != "" {
		return n, h
	}
	if useWG2B(nq, H, tps) {
		return mlaDecodeWG2BName, mlaPrefillH1Heads
	}
	return mlaDecodeWG2Name, mlaPrefillH1Heads
}

// useWG2B says whether MLADecodeWG2 launches mla_decode_wg2b for nq rows
// of H heads in ranges of tps tokens.
func useWG2B(nq, H, tps int) bool {
	return MLAWG2B && tps == mlaPrefillH1Tile && nq*cdiv(H, mlaPrefillH1Heads) <= mlaWG2BMaxHeadBlocks
}

func mlaWG2SplitsFor(sms, nq, H, nidx int) int {
	return mlaSplitsFor(sms, nq, H, nidx, mlaPrefillH1Heads, mlaPrefillH1Tile, mlaWG2MaxSplits)
}

// MLAWG2Splits picks how many token ranges MLADecodeWG2 splits nidx
// selections into: the blocks (rows x head blocks x ranges) fill the SMs
// once, whole 64-token tiles a range, at most mlaWG2MaxSplits.
func (k *Set) MLAWG2Splits(nq, H, nidx int) int {
	return mlaWG2SplitsFor(k.c.Info().SMs, nq, H, nidx)
}

// MLAWG2WorkspaceBytes bounds the partials MLADecodeWG2 writes with the
// splits of MLAWG2Splits for any nq <= maxRows, any nidx and any device.
func MLAWG2WorkspaceBytes(maxRows, H int) int64 {
	return mlaWorkspaceFor(maxRows, H, mlaWG2SplitsFor)
}

// MLADecodeWG2 is MLADecode over the fp8_ds_mla cache (same arguments and
// results, to one fp16 part's rounding: mla_prefill_wg2's arithmetic) with
// nsplit token ranges (ws of MLAWorkspaceBytes(nq, H, nsplit) bytes when
// nsplit > 1). blockTable: 64-entry pages as MLADecode's; rowBase != 0:
// row r's cache region is rowBase[r] + cache (int64 offsets in device
// memory; cache then holds the layer's offset).
func (k *Set) MLADecodeWG2(s cuda.Stream, out, lse, qn, qp, cache, blockTable, rowBase, indices, lens, ws cuda.DevPtr, nq, H, nidx, ldIdx, nsplit int, scale float32) error {
	if err := mlaPrefillH1Kernel.checkArgs(indices, ws, nq, H, nidx, ldIdx, nsplit); err != nil || nq > 65535 || nsplit > 256 {
		return errors.WithHint(errors.Newf("%s: nq=%d (1..65535) H=%d nidx=%d ldIdx=%d nsplit=%d (1..256)", mlaDecodeWG2Name, nq, H, nidx, ldIdx, nsplit),
			"nq, H and nidx must be positive, ldIdx >= nidx when indices are given, and splits need the workspace")
	}
	if out == 0 || qn == 0 || qp == 0 || (cache == 0 && rowBase == 0) || lens == 0 {
		return errors.WithHint(errors.Newf("%s: out %#x qn %#x qp %#x cache %#x lens %#x", mlaDecodeWG2Name, uint64(out), uint64(qn), uint64(qp), uint64(cache), uint64(lens)),
			"pass device buffers for the output, the queries, the cache and the row lengths")
	}
	mod, err := k.wg()
	if err != nil {
		return errors.WithHint(errors.Wrap(err, mlaDecodeWG2Name), "it needs an H100/H200 (sm_90a) and NVRTC 12+; unset TILERT_GPU_MLA_WG for the default kernel")
	}
	tps := cdiv(cdiv(nidx, max(1, nsplit)), mlaPrefillH1Tile) * mlaPrefillH1Tile
	name, hpb := wg2Kernel(nq, H, tps)
	if hpb != mlaPrefillH1Heads {
		MLAWG2HLaunches.Add(1)
	}
	f, err := k.c.Function(mod, name)
	if err != nil {
		return err
	}
	if _, ok := bigShared.Load(f); !ok {
		if err := k.c.SetMaxDynamicShared(f, MLAPrefillWG2SmemBytes); err != nil {
			return errors.WithHint(err, name+" needs 231,432 bytes (226 KiB) of shared memory per block")
		}
		bigShared.Store(f, true)
	}
	nsplit = cdiv(nidx, tps)
	partO, partML := ws, ws.Add(int64(nq*H*nsplit)*MLALatentDim*4)
	if err := k.launchFn(f, cuda.D3(nsplit, nq, cdiv(H, hpb)), cuda.D1(mlaPrefillWG2Threads), MLAPrefillWG2SmemBytes, s,
		qn, qp, cache, blockTable, indices, ldIdx, nidx, lens, out, lse, H, scale, tps, partO, partML, rowBase); err != nil {
		return err
	}
	if nsplit == 1 {
		return nil
	}
	return k.launch(mlaCombineFor(k.c.Info().SMs, nq*H), cuda.D1(nq*H), cuda.D1(128), 0, s, partO, partML, nsplit, out, lse)
}
