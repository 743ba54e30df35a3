package gpu

import (
	"os"
	"sync/atomic"

	"github.com/tilert-go/tilert/cuda"
	"github.com/tilert-go/tilert/cuda/kernels"
)

// idxOneOn: TILERT_GPU_IDX_ONE=1 (opt-in, issue 10, helper idxone, session
// 15) runs the serving indexer's pair for rows of more than idxOneMinT keys
// (indexer_scores_mma_pf + topk_radix_mark_l, two launches) as one launch,
// kernels.IndexerTopKOne (cu/indexer_one.cu: the same score bits and
// selection, element for element; two grid barriers in a one-wave grid).
// Rows up to idxOneMinT keep topk_radix_one; shapes the kernel's plan does
// not take (more rows than one wave holds at this length) and the slot-merged
// launch keep the pair. =1 launches it cooperatively (the driver places the
// whole grid at once: safe beside any other kernel, e.g. several ranks'
// engines sharing one GPU); =plain launches it plainly (no cooperative
// attribute: safe while no other grid-barrier kernel shares the device,
// as with one rank per GPU).
var idxOneOn, idxOneCoop = func() (bool, bool) {
	switch os.Getenv("TILERT_GPU_IDX_ONE") {
	case "1":
		return true, true
	case "plain":
		return true, false
	}
	return false, false
}()

// idxOneMinT: longer rows take the fused launch. A variable only so that
// TestGPUIdxOne runs the tiny presets' short rows through it.
var idxOneMinT = kernels.TopKRadixOneMaxT

// idxOneLaunches counts the fused launches (tests: the switch did not fall
// back to the pair).
var idxOneLaunches atomic.Int64

func idxOneOK(T int) bool { return idxOneOn && T > idxOneMinT }

func (b *cudaDevice) indexerTopKOne(sel, out, qh, wq, cache, lens, scratch cuda.DevPtr, nq, T, K, ldOut, ldSel int) error {
	if !b.k.IndexerTopKOneFits(nq, T) {
		if err := b.indexerScoresQ(out, qh, wq, cache, lens, kernels.TopKRadixHist(scratch), nq, T, ldOut); err != nil {
			return err
		}
		return b.topKAfterHist(sel, out, lens, scratch, nq, T, K, ldOut, ldSel)
	}
	idxOneLaunches.Add(1)
	return b.k.IndexerTopKOne(b.s, sel, out, qh, wq, cache, 0, lens, scratch, nq, T, K, ldOut, ldSel, idxOneCoop)
}
