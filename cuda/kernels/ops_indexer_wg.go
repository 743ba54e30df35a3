package kernels

import (
	"github.com/cockroachdb/errors"

	"github.com/tilert-go/tilert/cuda"
)

// indexer_scores_wg (cu/wg/wg_indexer.cu, the sm_90a module): the serving
// indexer's scores on wgmma.mma_async m64n64k32 e4m3, Hopper's fp8
// tensor-core instruction (its e4m3 mma.sync is emulated with f16
// conversions). A block of one warpgroup takes whole 64-key pages.

// indexerWGBlocks: at most perSM blocks a SM over all rows (one wave), at
// most one per page.
func indexerWGBlocks(sms, nq, T int) int {
	const perSM = 4 // 42.5 KB of static shared memory and 128 threads a block
	return max(1, min(cdiv(T, IndexerPageTokens), cdiv(perSM*max(1, sms), nq)))
}

// IndexerScoresWG is IndexerScoresMMA (same arguments, outputs and
// histogram) on wgmma: compute capability 9.0 with an NVRTC that builds
// sm_90a (WGSupported). Its head sums are wgmma's fp8 accumulation.
func (k *Set) IndexerScoresWG(s cuda.Stream, out, qh, wq, cache, blockTable, lens, hist cuda.DevPtr, nq, T, ldOut int) error {
	return k.indexerScoresWG("indexer_scores_wg", s, out, qh, wq, cache, blockTable, lens, hist, nq, T, ldOut)
}

// IndexerScoresWGRows is IndexerScoresMMARows on wgmma (row r's pages at
// rowBase[r] + cacheOff).
func (k *Set) IndexerScoresWGRows(s cuda.Stream, out, qh, wq cuda.DevPtr, cacheOff int64, rowBase, lens, hist cuda.DevPtr, nq, T, ldOut int) error {
	if rowBase == 0 {
		return errors.New("indexer wg rows: no row bases")
	}
	return k.indexerScoresWG("indexer_scores_wg_rows", s, out, qh, wq, cuda.DevPtr(cacheOff), rowBase, lens, hist, nq, T, ldOut)
}

func (k *Set) indexerScoresWG(name string, s cuda.Stream, out, qh, wq, cache, btOrBase, lens, hist cuda.DevPtr, nq, T, ldOut int) error {
	if nq <= 0 || nq > 65535 || T <= 0 || ldOut < T {
		return errors.Newf("%s: nq=%d T=%d ldOut=%d", name, nq, T, ldOut)
	}
	mod, err := k.wg()
	if err != nil {
		return errors.WithHint(errors.Wrap(err, name), "it needs an H100/H200 (sm_90a) and NVRTC 12+; unset TILERT_GPU_IDX_F8 (or =1, the mma.sync kernel)")
	}
	f, err := k.c.Function(mod, name)
	if err != nil {
		return err
	}
	nbx := indexerWGBlocks(k.c.Info().SMs, nq, T)
	return k.launchFn(f, cuda.D3(nbx, nq, 1), cuda.D1(128), 0, s, qh, wq, cache, btOrBase, lens, out, T, ldOut, hist)
}

// wgiProbe runs count independent wgmma m64n8k32 e4m3 products d = a.b^T +
// c (a [count][64][32], b [count][8][32] e4m3 bytes, c, d [count][64][8]
// float32). Checks only: it measures wgmma's fp8 accumulation.
func (k *Set) wgiProbe(s cuda.Stream, d, a, b, c cuda.DevPtr, count int) error {
	mod, err := k.wg()
	if err != nil {
		return err
	}
	f, err := k.c.Function(mod, "wgi_probe")
	if err != nil {
		return err
	}
	return k.launchFn(f, cuda.D1(min(count, 1024)), cuda.D1(128), 0, s, a, b, c, d, count)
}
