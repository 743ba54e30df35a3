package kernels

import (
	"github.com/cockroachdb/errors"

	"github.com/tilert-go/tilert/cuda"
)

// IndexerScoresF8 is IndexerScoresMMA (same arguments, outputs, grid and
// histogram) on the fp8 tensor-core instruction (cu/indexer_mma_f8.cu:
// mma.sync m16n8k32 e4m3, no f16 conversions, half the mma count). Its
// per-head sums are the instruction's own accumulation of the exact e4m3
// products, which need not be float32's: TestKernelIndexerF8 measures how
// far the scores and the top-k selection move from IndexerScoresMMA's.
func (k *Set) IndexerScoresF8(s cuda.Stream, out, qh, wq, cache, blockTable, lens, hist cuda.DevPtr, nq, T, ldOut int) error {
	if nq <= 0 || T <= 0 || ldOut < T {
		return errors.Newf("indexer f8: nq=%d T=%d ldOut=%d", nq, T, ldOut)
	}
	if !k.IndexerMMASupported() {
		i := k.c.Info()
		return errors.WithHint(errors.Newf("indexer f8: device %s is below sm_89 (no e4m3 mma.sync)", i.Arch()), "unset TILERT_GPU_IDX_F8")
	}
	f, err := k.f8Fn("indexer_scores_f8")
	if err != nil {
		return err
	}
	nbx := indexerMMABlocks(k.c.Info().SMs, 2, nq, T)
	return k.launchFn(f, cuda.D3(nbx, nq, 1), cuda.D1(256), 0, s, qh, wq, cache, blockTable, lens, out, T, ldOut, hist)
}

// f8Fn finds a kernel of cu/indexer_mma_f8.cu, which the module holds only
// when NVRTC knows the e4m3 mma.sync (12.4 and later).
func (k *Set) f8Fn(name string) (*cuda.Function, error) {
	f, err := k.fn(name)
	if err != nil {
		return nil, errors.WithHint(errors.Wrap(err, name), "the e4m3 mma.sync needs NVRTC 12.4 or newer (set TILERT_NVRTC to its libnvrtc.so); or unset TILERT_GPU_IDX_F8")
	}
	return f, nil
}

// IndexerScoresF8Rows is IndexerScoresMMARows on the fp8 instruction (row
// r's pages at rowBase[r] + cacheOff).
func (k *Set) IndexerScoresF8Rows(s cuda.Stream, out, qh, wq cuda.DevPtr, cacheOff int64, rowBase, lens, hist cuda.DevPtr, nq, T, ldOut int) error {
	if rowBase == 0 {
		return errors.New("indexer f8 rows: no row bases")
	}
	if nq <= 0 || T <= 0 || ldOut < T {
		return errors.Newf("indexer f8 rows: nq=%d T=%d ldOut=%d", nq, T, ldOut)
	}
	if !k.IndexerMMASupported() {
		i := k.c.Info()
		return errors.WithHint(errors.Newf("indexer f8 rows: device %s is below sm_89 (no e4m3 mma.sync)", i.Arch()), "unset TILERT_GPU_IDX_F8")
	}
	f, err := k.f8Fn("indexer_scores_f8_rows")
	if err != nil {
		return err
	}
	nbx := indexerMMABlocks(k.c.Info().SMs, 2, nq, T)
	return k.launchFn(f, cuda.D3(nbx, nq, 1), cuda.D1(256), 0, s, qh, wq, cuda.DevPtr(cacheOff), rowBase, lens, out, T, ldOut, hist)
}

// f8MMAProbe runs count independent m16n8k32 e4m3 products d = a.b^T + c
// (a [count][16][32], b [count][8][32] e4m3 bytes, c, d [count][16][8]
// float32) on the fp8 instruction (f16 false) or through the f16 path of
// IndexerScoresMMA (f16 true). Checks only: it measures the accumulation.
func (k *Set) f8MMAProbe(s cuda.Stream, d, a, b, c cuda.DevPtr, count int, f16 bool) error {
	if f16 {
		return k.launch("f16_mma_probe", cuda.D1(min(count, 1024)), cuda.D1(32), 0, s, a, b, c, d, count)
	}
	f, err := k.f8Fn("f8_mma_probe")
	if err != nil {
		return err
	}
	return k.launchFn(f, cuda.D1(min(count, 1024)), cuda.D1(32), 0, s, a, b, c, d, count)
}
