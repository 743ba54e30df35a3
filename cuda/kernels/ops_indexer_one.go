package kernels

import (
	"sync"

	"github.com/cockroachdb/errors"

	"github.com/tilert-go/tilert/cuda"
)

// The indexer's scores and top-k in one launch (cu/indexer_one.cu,
// indexer_topk_one): IndexerScoresMMA with its histogram, then
// TopKRadixAfterHist, in one grid that meets at two grid barriers.
const (
	// idxOneKeysPerBlock bounds the keys a block holds (IDX1_KMAX).
	idxOneKeysPerBlock = 2048
	// idxOnePerSM is the blocks an SM holds by the kernel's launch bounds
	// (256 threads, 2 blocks); the occupancy query can lower it.
	idxOnePerSM = 2
)

// idxOneOcc caches the occupancy query per function.
var idxOneOcc sync.Map

// idxOnePlan is indexer_topk_one's blocks per row: IndexerScoresMMA's
// one-wave plan (perSM blocks an SM), capped so that all nq rows' blocks
// are co-resident (the grid barriers need every block running). ok is
// false when a block would hold more than idxOneKeysPerBlock keys.
func idxOnePlan(sms, perSM, nq, T int) (nbx int, ok bool) {
	nbx = indexerMMABlocks(sms, perSM, nq, T)
	nbx = min(nbx, sms*perSM/nq)
	if nbx < 1 {
		return 0, false
	}
	sweeps := cdiv(cdiv(T, 16), 8*nbx) // 128-key segments a block scores
	return nbx, sweeps*128 <= idxOneKeysPerBlock
}

// IndexerTopKOneFits says whether IndexerTopKOne takes nq rows of T keys
// on this device (its grid fits one wave with at most
// idxOneKeysPerBlock keys a block).
func (k *Set) IndexerTopKOneFits(nq, T int) bool {
	if nq <= 0 || T <= 0 || !k.IndexerMMASupported() {
		return false
	}
	_, ok := idxOnePlan(k.c.Info().SMs, idxOnePerSM, nq, T)
	return ok
}

// IndexerTopKOne is IndexerScoresMMA (scores written to out, bit for bit
// the same, with the histogram in scratch) followed by TopKRadixAfterHist
// (sel [nq][ldSel], element for element the same) in one launch. scratch:
// TopKRadixScratchBytes(nq, T), zeroed before its first use and left
// zeroed, one call at a time. The grid is one wave: every block must be
// resident at once: the launcher sizes it from the occupancy query, and
// coop launches it cooperatively (cuda.Ctx.LaunchCooperative), which the
// driver runs only with every block resident. A plain launch (coop false)
// relies on the device being otherwise free enough to take the whole grid
// at once: kernels beside it (another stream) end by themselves, so the
// waiting blocks get the SMs they need, but two grid-barrier launches on
// streams of one device (several ranks sharing a GPU) could hold SMs each
// other's blocks need.
func (k *Set) IndexerTopKOne(s cuda.Stream, sel, out, qh, wq, cache, blockTable, lens, scratch cuda.DevPtr, nq, T, K, ldOut, ldSel int, coop bool) error {
	if nq <= 0 || T <= 0 || K <= 0 || ldOut < T || ldSel < K || scratch == 0 {
		return errors.Newf("indexer topk one: nq=%d T=%d K=%d ldOut=%d ldSel=%d scratch=%#x", nq, T, K, ldOut, ldSel, uint64(scratch))
	}
	if !k.IndexerMMASupported() {
		i := k.c.Info()
		return errors.WithHint(errors.Newf("indexer topk one: device %s is below sm_89", i.Arch()), "unset TILERT_GPU_IDX_ONE")
	}
	f, err := k.fn("indexer_topk_one")
	if err != nil {
		return err
	}
	perSM := idxOnePerSM
	if v, ok := idxOneOcc.Load(f); ok {
		perSM = v.(int)
	} else {
		n, err := k.c.MaxActiveBlocks(f, 256, 0)
		switch {
		case errors.Is(err, cuda.ErrNoOccupancy):
			n = 1 // one block an SM is resident whatever the driver says
		case err != nil:
			return err
		}
		perSM = min(n, idxOnePerSM)
		idxOneOcc.Store(f, perSM)
	}
	if perSM < 1 {
		return errors.WithHint(errors.New("indexer topk one: the occupancy query says no block fits an SM"), "unset TILERT_GPU_IDX_ONE")
	}
	nbx, ok := idxOnePlan(k.c.Info().SMs, perSM, nq, T)
	if !ok {
		return errors.WithHintf(errors.Newf("indexer topk one: %d rows of %d keys do not fit one wave of %d-key blocks", nq, T, idxOneKeysPerBlock),
			"check IndexerTopKOneFits first, or unset TILERT_GPU_IDX_ONE")
	}
	l, _ := topkRadixLayout(nq, T)
	args := []any{qh, wq, cache, blockTable, lens, out, T, ldOut, K,
		TopKRadixHist(scratch), scratch.Add(int64(l.sure)), l.ldw, scratch.Add(int64(l.l2)), scratch.Add(int64(l.list)), T,
		sel, ldSel}
	if coop {
		return k.c.LaunchCooperative(f, cuda.D3(nbx, nq, 1), cuda.D1(256), 0, s, args...)
	}
	// Plain, never programmatic: the kernel triggers its dependents itself,
	// after its last grid barrier (not listed in pdl.go).
	return k.launchFn(f, cuda.D3(nbx, nq, 1), cuda.D1(256), 0, s, args...)
}
