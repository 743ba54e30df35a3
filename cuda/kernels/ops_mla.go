package kernels

import (
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
	blocks := max(1, nq*cdiv(H, mlaHeadsGroup)) // H = 0: a tensor-parallel rank without heads
	want := cdiv(min(max(1, sms), mlaHeadsMaxSMs), blocks)
	return max(1, min(want, cdiv(nidx, mlaHeadsTile), mlaHeadsSplits))
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
	var most int64
	for nq := 1; nq <= maxRows; nq++ {
		most = max(most, MLAWorkspaceBytes(nq, H, mlaHeadsSplitsFor(mlaHeadsMaxSMs, nq, H, 1<<30)))
	}
	return most
}

// MLADecodeHeads is MLADecode (same arguments and results) computed with
// the heads as the rows of small matrix products over each 32-token tile of
// the cache, dequantised once into shared memory. nsplit > 1 needs ws of
// MLAWorkspaceBytes(nq, H, nsplit) bytes; mla_combine merges the ranges.
func (k *Set) MLADecodeHeads(s cuda.Stream, out, lse, qn, qp, cache, blockTable, indices, lens, ws cuda.DevPtr, nq, H, nidx, ldIdx, nsplit int, scale float32) error {
	if nq <= 0 || H <= 0 || nidx <= 0 || (indices != 0 && ldIdx < nidx) || nsplit <= 0 || nsplit > mlaHeadsSplits || (nsplit > 1 && ws == 0) {
		return errors.Newf("mla heads: nq=%d H=%d nidx=%d ldIdx=%d nsplit=%d (1..%d) ws=%#x", nq, H, nidx, ldIdx, nsplit, mlaHeadsSplits, uint64(ws))
	}
	f, err := k.fn("mla_decode_heads")
	if err != nil {
		return err
	}
	if _, ok := bigShared.Load(f); !ok {
		if err := k.c.SetMaxDynamicShared(f, MLAHeadsSmemBytes); err != nil {
			return errors.WithHint(err, "mla_decode_heads needs ~127 KiB of shared memory per block (sm_80 or newer)")
		}
		bigShared.Store(f, true)
	}
	tps := cdiv(cdiv(nidx, nsplit), mlaHeadsTile) * mlaHeadsTile
	nsplit = cdiv(nidx, tps)
	partO, partML := ws, ws.Add(int64(nq*H*nsplit)*MLALatentDim*4)
	if err := k.c.Launch(f, cuda.D3(nsplit, nq, cdiv(H, mlaHeadsGroup)), cuda.D1(256), MLAHeadsSmemBytes, s,
		qn, qp, cache, blockTable, indices, ldIdx, nidx, lens, out, lse, H, scale, tps, partO, partML); err != nil {
		return err
	}
	if nsplit == 1 {
		return nil
	}
	return k.launch("mla_combine", cuda.D1(nq*H), cuda.D1(128), 0, s, partO, partML, nsplit, out, lse)
}
