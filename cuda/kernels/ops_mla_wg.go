package kernels

import (
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
