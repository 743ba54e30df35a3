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
	// The two-warpgroup blocks (short rows).
	indexerWGH2Name     = "indexer_scores_wgh2"
	indexerWGH2RowsName = "indexer_scores_wgh2_rows"
	// indexerWGHPerSM is the blocks an SM the grid plans for
	// (__launch_bounds__(128, 4); 32 KB of static shared memory a block).
	indexerWGHPerSM = 4
)

// IndexerWGHLaunches counts launches of the wgh kernels, IndexerWGH2Launches
// those on two-warpgroup blocks (tests: no silent fallback).
var IndexerWGHLaunches, IndexerWGH2Launches atomic.Int64

// indexerWGHBlocks: one warpgroup a block, each taking every nbx-th
// 64-key page of its row; as many pages a block as fill the SMs once.
func indexerWGHBlocks(sms, nq, T int) int {
	pages := cdiv(T, IndexerPageTokens)
	ppb := max(1, cdiv(pages*nq, indexerWGHPerSM*max(1, sms)))
	return max(1, cdiv(pages, ppb))
}

// indexerWGHLaunch: the kernel and grid for nq rows of T keys; pair: the
// two-warpgroup blocks (IndexerScoresWGH2).
func indexerWGHLaunch(name string, pair bool, sms, nq, T int) (string, cuda.Dim3, cuda.Dim3) {
	nbx := indexerWGHBlocks(sms, nq, T)
	if !pair {
		return name, cuda.D3(nbx, nq, 1), cuda.D1(128)
	}
	return map[string]string{indexerWGHName: indexerWGH2Name, indexerWGHRowsName: indexerWGH2RowsName}[name], cuda.D3(cdiv(nbx, 2), nq, 1), cuda.D1(256)
}

// IndexerScoresWGH is IndexerScoresMMA (the same arguments, output, -inf
// tail and histogram contract; float32 sums in another order) on
// indexer_scores_wgh: the keys as wgmma's M, the query read by the tensor
// cores from shared memory. It needs the sm_90a module (WGSupported).
func (k *Set) IndexerScoresWGH(s cuda.Stream, out, qh, wq, cache, blockTable, lens, hist cuda.DevPtr, nq, T, ldOut int) error {
	return k.indexerScoresWGH(false, s, out, qh, wq, cache, blockTable, lens, hist, nq, T, ldOut)
}

// IndexerScoresWGH2 is IndexerScoresWGH (the same scores, bit for bit) on
// indexer_scores_wgh2: blocks of two warpgroups sharing the query's staging
// and the histogram, for rows of few pages a warpgroup, where a
// one-warpgroup block's prologue is uncovered (session 40: 3.98 us against
// _pf's 3.71 at 8256 keys). Opt-in, NOT RUN on a GPU (session 40, after
// its device time); the engine takes it with TILERT_GPU_IDX_WGH=2.
func (k *Set) IndexerScoresWGH2(s cuda.Stream, out, qh, wq, cache, blockTable, lens, hist cuda.DevPtr, nq, T, ldOut int) error {
	return k.indexerScoresWGH(true, s, out, qh, wq, cache, blockTable, lens, hist, nq, T, ldOut)
}

func (k *Set) indexerScoresWGH(pair bool, s cuda.Stream, out, qh, wq, cache, blockTable, lens, hist cuda.DevPtr, nq, T, ldOut int) error {
	if err := indexerWGHArgs(indexerWGHName, out, qh, wq, cache, lens, nq, T, ldOut); err != nil {
		return err
	}
	return k.launchWGH(indexerWGHName, pair, s, nq, T, qh, wq, cache, blockTable, lens, out, T, ldOut, hist)
}

// IndexerScoresWGHRows is IndexerScoresWGH over rows of different caches
// (slots) in one launch, as IndexerScoresMMARows: row r's pages start at
// rowBase[r] + cacheOff.
func (k *Set) IndexerScoresWGHRows(s cuda.Stream, out, qh, wq cuda.DevPtr, cacheOff int64, rowBase, lens, hist cuda.DevPtr, nq, T, ldOut int) error {
	return k.indexerScoresWGHRows(false, s, out, qh, wq, cacheOff, rowBase, lens, hist, nq, T, ldOut)
}

// IndexerScoresWGH2Rows is IndexerScoresWGHRows on the two-warpgroup
// blocks (IndexerScoresWGH2).
func (k *Set) IndexerScoresWGH2Rows(s cuda.Stream, out, qh, wq cuda.DevPtr, cacheOff int64, rowBase, lens, hist cuda.DevPtr, nq, T, ldOut int) error {
	return k.indexerScoresWGHRows(true, s, out, qh, wq, cacheOff, rowBase, lens, hist, nq, T, ldOut)
}

func (k *Set) indexerScoresWGHRows(pair bool, s cuda.Stream, out, qh, wq cuda.DevPtr, cacheOff int64, rowBase, lens, hist cuda.DevPtr, nq, T, ldOut int) error {
	if rowBase == 0 {
		return errors.WithHint(errors.New(indexerWGHRowsName+": no row bases"), "pass nq int64 page bases in device memory")
	}
	if err := indexerWGHArgs(indexerWGHRowsName, out, qh, wq, 1, lens, nq, T, ldOut); err != nil {
		return err
	}
	return k.launchWGH(indexerWGHRowsName, pair, s, nq, T, qh, wq, cuda.DevPtr(cacheOff), rowBase, lens, out, T, ldOut, hist)
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

// launchWGH launches kernel name (or its two-warpgroup form) from the
// sm_90a module over nq rows of T keys, counting the launch.
func (k *Set) launchWGH(name string, pair bool, s cuda.Stream, nq, T int, args ...any) error {
	name, grid, block := indexerWGHLaunch(name, pair, k.c.Info().SMs, nq, T)
	mod, err := k.wg()
	if err != nil {
		return errors.WithHint(errors.Wrap(err, name), "it needs an H100/H200 (sm_90a) and NVRTC 12+; IndexerScoresMMA runs everywhere from sm_89")
	}
	f, err := k.c.Function(mod, name)
	if err != nil {
		return err
	}
	IndexerWGHLaunches.Add(1)
	if pair {
		IndexerWGH2Launches.Add(1)
	}
	return k.launchFn(f, grid, block, 0, s, args...)
}
