package kernels

import (
	"github.com/cockroachdb/errors"

	"github.com/tilert-go/tilert/cuda"
)

// The tensor-core indexer (cu/indexer_mma.cu): IndexerQPrep turns a row's
// indexer query into fp8 codes in mma fragment order plus per-head weights,
// IndexerScoresMMA scores the fp8 pages with them.
const (
	// IndexerQRowBytes is one row of IndexerQPrep's query codes.
	IndexerQRowBytes = 8192
	// IndexerQHeads is the heads a row holds (IndexerQPrep pads with
	// zeros); more indexer heads need the float kernels.
	IndexerQHeads = 64
)

// IndexerQByte is the byte of a row of IndexerQPrep's output that holds head
// h, dimension d (cu/indexer_mma.cu explains the order).
func IndexerQByte(h, d int) int {
	mt, r := h>>4, h&15
	g, hi := r&7, r>>3
	dd := d & 63
	ks := (d>>6)<<2 + (dd&15)>>2
	c, off := dd>>4, d&3
	j := 2*hi + off
	if off >= 2 {
		j = 4 + 2*hi + off - 2
	}
	return ((mt*8+ks)*32+g*4+c)*8 + j
}

// IndexerQPrep applies RoPE (RoPE's arithmetic; pairs as there) to
// dimensions [0, rot) of q ([M][H][128] float32, left unchanged), quantises
// each head to fp8 with a power-of-two scale (EngQuantUE8M0's rounding) and
// writes the codes to qh ([M][IndexerQRowBytes], IndexerQByte order) and
// wq[m][h] = w[m][h] * wscale * scale[m][h] ([M][IndexerQHeads], zero for
// h >= H).
func (k *Set) IndexerQPrep(s cuda.Stream, qh, wq, q, w, pos, cos, sin cuda.DevPtr, M, H, rot int, interleaved bool, wscale float32) error {
	if M <= 0 || H <= 0 || H > IndexerQHeads || rot < 0 || rot > IndexerHeadDim || rot%8 != 0 {
		return errors.Newf("indexer q prep: M=%d H=%d (at most %d) rot=%d (a multiple of 8 up to %d)", M, H, IndexerQHeads, rot, IndexerHeadDim)
	}
	il := 0
	if interleaved {
		il = 1
	}
	return k.launch("idx_q_prep", cuda.D3(IndexerQHeads/16, M, 1), cuda.D1(512), 0, s, q, w, pos, cos, sin, qh, wq, H, rot, il, wscale)
}

// IndexerMMASupported says whether the device runs IndexerScoresMMA (f16
// mma.sync with the hardware fp8 conversion: sm_89 and later).
func (k *Set) IndexerMMASupported() bool {
	i := k.c.Info()
	return i.CCMajor*10+i.CCMinor >= 89
}

// indexerMMABlocks is the blocks per row of IndexerScoresMMA: at most
// perSM blocks of 8 warps per SM over all rows (one wave), each warp taking
// whole 16-key groups.
func indexerMMABlocks(sms, perSM, nq, T int) int {
	groups := cdiv(T, 16)
	gpw := max(1, cdiv(groups*nq, perSM*max(1, sms)*8))
	return max(1, cdiv(groups, 8*gpw))
}

// IndexerScoresMMA is IndexerScores over the fp8 pages (same output, float32
// sums in another order) with the query from IndexerQPrep: qh
// [nq][IndexerQRowBytes], wq [nq][IndexerQHeads] (H^-0.5 and qkScale folded
// in there). hist != 0 (TopKRadixHist of a TopKRadix scratch for nq rows):
// also build TopKRadix's histogram of the scores, for TopKRadixAfterHist.
// It runs indexer_scores_mma_pf (the next key group loaded before this
// one's products, two blocks per SM).
func (k *Set) IndexerScoresMMA(s cuda.Stream, out, qh, wq, cache, blockTable, lens, hist cuda.DevPtr, nq, T, ldOut int) error {
	if nq <= 0 || T <= 0 || ldOut < T {
		return errors.Newf("indexer mma: nq=%d T=%d ldOut=%d", nq, T, ldOut)
	}
	if !k.IndexerMMASupported() {
		i := k.c.Info()
		return errors.WithHint(errors.Newf("indexer mma: device %s is below sm_89", i.Arch()), "use IndexerScores (TILERT_GPU_IDX_MMA=0)")
	}
	nbx := indexerMMABlocks(k.c.Info().SMs, 2, nq, T)
	return k.launch("indexer_scores_mma_pf", cuda.D3(nbx, nq, 1), cuda.D1(256), 0, s, qh, wq, cache, blockTable, lens, out, T, ldOut, hist)
}

// IndexerScoresMMARows is IndexerScoresMMA over rows of different caches
// (slots) in one launch: row r's pages start at rowBase[r] + cacheOff
// (rowBase: nq int64 in device memory; cacheOff the layer's offset in
// every slot's region). The same scores as one launch per cache.
func (k *Set) IndexerScoresMMARows(s cuda.Stream, out, qh, wq cuda.DevPtr, cacheOff int64, rowBase, lens, hist cuda.DevPtr, nq, T, ldOut int) error {
	if rowBase == 0 {
		return errors.New("indexer mma rows: no row bases")
	}
	if nq <= 0 || T <= 0 || ldOut < T {
		return errors.Newf("indexer mma rows: nq=%d T=%d ldOut=%d", nq, T, ldOut)
	}
	if !k.IndexerMMASupported() {
		i := k.c.Info()
		return errors.WithHint(errors.Newf("indexer mma rows: device %s is below sm_89", i.Arch()), "one launch per slot (TILERT_GPU_SLOT_MERGE=0)")
	}
	nbx := indexerMMABlocks(k.c.Info().SMs, 2, nq, T)
	return k.launch("indexer_scores_mma_rows", cuda.D3(nbx, nq, 1), cuda.D1(256), 0, s, qh, wq, cuda.DevPtr(cacheOff), rowBase, lens, out, T, ldOut, hist)
}
