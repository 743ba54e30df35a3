package kernels

import (
	"sync/atomic"

	"github.com/cockroachdb/errors"

	"github.com/tilert-go/tilert/cuda"
)

// indexer_scores_wgh (cu/wg/scores_wgh.cu, the sm_90a module): the
// indexer's serving scores with the keys as wgmma's M and the heads as N.
const (
	indexerWGHName     = "indexer_scores_wgh"
	indexerWGHRowsName = "indexer_scores_wgh_rows"
	// indexerWGHPerSM is the blocks an SM the grid plans for
	// (__launch_bounds__(128, 4); 32 KB of static shared memory a block).
	indexerWGHPerSM = 4
)

// IndexerWGHLaunches counts launches of the wgh kernels (tests: no silent
// fallback).
var IndexerWGHLaunches atomic.Int64

// indexerWGHBlocks: one warpgroup a block, each taking every nbx-th
// 64-key page of its row; as many pages a block as fill the SMs once.
func indexerWGHBlocks(sms, nq, T int) int {
	pages := cdiv(T, IndexerPageTokens)
	ppb := max(1, cdiv(pages*nq, indexerWGHPerSM*max(1, sms)))
	return max(1, cdiv(pages, ppb))
}

// IndexerScoresWGH is IndexerScoresMMA (the same arguments, output, -inf
// tail and histogram contract; float32 sums in another order) on
// indexer_scores_wgh: the keys as wgmma's M, the query read by the tensor
// cores from shared memory. It needs the sm_90a module (WGSupported).
func (k *Set) IndexerScoresWGH(s cuda.Stream, out, qh, wq, cache, blockTable, lens, hist cuda.DevPtr, nq, T, ldOut int) error {
	if err := indexerWGHArgs(indexerWGHName, out, qh, wq, cache, lens, nq, T, ldOut); err != nil {
		return err
	}
	f, err := k.indexerWGHFn(indexerWGHName)
	if err != nil {
		return err
	}
	IndexerWGHLaunches.Add(1)
	nbx := indexerWGHBlocks(k.c.Info().SMs, nq, T)
	return k.launchFn(f, cuda.D3(nbx, nq, 1), cuda.D1(128), 0, s, qh, wq, cache, blockTable, lens, out, T, ldOut, hist)
}

// IndexerScoresWGHRows is IndexerScoresWGH over rows of different caches
// (slots) in one launch, as IndexerScoresMMARows: row r's pages start at
// rowBase[r] + cacheOff.
func (k *Set) IndexerScoresWGHRows(s cuda.Stream, out, qh, wq cuda.DevPtr, cacheOff int64, rowBase, lens, hist cuda.DevPtr, nq, T, ldOut int) error {
	if rowBase == 0 {
		return errors.WithHint(errors.New(indexerWGHRowsName+": no row bases"), "pass nq int64 page bases in device memory")
	}
	if err := indexerWGHArgs(indexerWGHRowsName, out, qh, wq, 1, lens, nq, T, ldOut); err != nil {
		return err
	}
	f, err := k.indexerWGHFn(indexerWGHRowsName)
	if err != nil {
		return err
	}
	IndexerWGHLaunches.Add(1)
	nbx := indexerWGHBlocks(k.c.Info().SMs, nq, T)
	return k.launchFn(f, cuda.D3(nbx, nq, 1), cuda.D1(128), 0, s, qh, wq, cuda.DevPtr(cacheOff), rowBase, lens, out, T, ldOut, hist)
}

func indexerWGHArgs(name string, out, qh, wq, cache, lens cuda.DevPtr, nq, T, ldOut int) error {
	if nq <= 0 || nq > 65535 || T <= 0 || ldOut < T {
		return errors.WithHint(errors.Newf("%s: nq=%d T=%d ldOut=%d", name, nq, T, ldOut),
			"nq must be 1..65535, T positive and ldOut >= T")
	}
	if out == 0 || qh == 0 || wq == 0 || cache == 0 || lens == 0 {
		return errors.WithHint(errors.Newf("%s: out %#x qh %#x wq %#x cache %#x lens %#x", name, uint64(out), uint64(qh), uint64(wq), uint64(cache), uint64(lens)),
			"pass device buffers for the scores, IndexerQPrep's query and weights, the key pages and the row lengths")
	}
	return nil
}

func (k *Set) indexerWGHFn(name string) (*cuda.Function, error) {
	mod, err := k.wg()
	if err != nil {
		return nil, errors.WithHint(errors.Wrap(err, name), "it needs an H100/H200 (sm_90a) and NVRTC 12+; IndexerScoresMMA runs everywhere from sm_89")
	}
	return k.c.Function(mod, name)
}
