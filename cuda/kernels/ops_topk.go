package kernels

import (
	"github.com/cockroachdb/errors"

	"github.com/tilert-go/tilert/cuda"
)

// Wide top-k (cu/topk_wide.cu): TopK's results with every pass spread over
// up to topkWideBlocks blocks per row.
const (
	topkWideBlocks = 128
	topkWideState  = 4
	topkWideHist   = 256
	// TopKWideMinT is the row length from which the engine prefers TopKWide
	// (below it one block per row is as fast as ten launches).
	TopKWideMinT = 8192
)

// TopKWideScratchBytes is the scratch TopKWide needs for rows rows.
func TopKWideScratchBytes(rows int) int64 {
	return int64(rows) * (topkWideState + topkWideHist + 2*topkWideBlocks) * 4
}

// topkWidePlan splits T scores into nb chunks of whole 256-key tiles, at
// least 1024 keys each.
func topkWidePlan(T int) (nb, chunk int) {
	chunk = max(1024, cdiv(cdiv(T, topkWideBlocks), 256)*256)
	return cdiv(T, chunk), chunk
}

// TopKWide is TopK (same arguments, same output) for long rows: four radix
// passes, each a histogram over many blocks and a one-block digit pick, then
// a count and an ordered emit over many blocks. scratch holds
// TopKWideScratchBytes(rows) bytes, zeroed before its first use and left
// zeroed (graph replay safe), used by one call at a time.
func (k *Set) TopKWide(s cuda.Stream, out, scores, lens, scratch cuda.DevPtr, rows, T, K, ld, ldOut int) error {
	if rows <= 0 || T <= 0 || K <= 0 || ld < T || ldOut < K || scratch == 0 {
		return errors.Newf("topk wide: rows=%d T=%d K=%d ld=%d ldOut=%d scratch=%#x", rows, T, K, ld, ldOut, uint64(scratch))
	}
	nb, chunk := topkWidePlan(T)
	state := scratch
	hist := state.Add(int64(rows * topkWideState * 4))
	counts := hist.Add(int64(rows * topkWideHist * 4))
	for shift := 24; shift >= 0; shift -= 8 {
		if err := k.launch("topk_wide_hist", cuda.D3(nb, rows, 1), cuda.D1(256), 0, s, scores, ld, lens, T, chunk, shift, state, hist); err != nil {
			return err
		}
		if err := k.launch("topk_wide_pick", cuda.D1(rows), cuda.D1(256), 0, s, lens, T, K, shift, state, hist, out, ldOut); err != nil {
			return err
		}
	}
	if err := k.launch("topk_wide_count", cuda.D3(nb, rows, 1), cuda.D1(256), 0, s, scores, ld, lens, T, chunk, state, counts); err != nil {
		return err
	}
	return k.launch("topk_wide_emit", cuda.D3(nb, rows, 1), cuda.D1(256), 0, s, scores, ld, lens, T, chunk, state, counts, out, ldOut)
}

// indexerWideSmemBytes is indexer_scores_wide's dynamic shared memory
// (IDXW_SMEM_FLOATS floats).
const indexerWideSmemBytes = 4 * (64*132 + 32*128 + 32 + 8*64)

// IndexerScoresWide is IndexerScores (same arguments, same scores up to
// float32 summation order) with register-tiled products: for long
// contexts, where the indexer is a 64-head x 128 product against every key.
func (k *Set) IndexerScoresWide(s cuda.Stream, out, q, w, cache, blockTable, lens cuda.DevPtr, nq, H, T, ldOut int, qkScale float32) error {
	if nq <= 0 || H <= 0 || T <= 0 || ldOut < T {
		return errors.Newf("indexer wide: nq=%d H=%d T=%d ldOut=%d", nq, H, T, ldOut)
	}
	f, err := k.fn("indexer_scores_wide")
	if err != nil {
		return err
	}
	if _, ok := bigShared.Load(f); !ok {
		if err := k.c.SetMaxDynamicShared(f, indexerWideSmemBytes); err != nil {
			return err
		}
		bigShared.Store(f, true)
	}
	return k.launchFn(f, cuda.D3(cdiv(T, IndexerPageTokens), nq, 1), cuda.D1(256), indexerWideSmemBytes, s, q, w, cache, blockTable, lens, out, H, T, ldOut, qkScale)
}

// Radix top-k (cu/topk_radix.cu): TopK's results in two launches, the
// scan of the row spread over many blocks and only the keys of the
// threshold's 12-bit bin refined, by the last block of the row to finish.
const topkRadixBins = 4096

// topkRadixLayout is the scratch layout for rows rows of up to T scores:
// histograms, counters, then the two bitmaps; it returns their offsets and
// the total bytes.
func topkRadixLayout(rows, T int) (cnt, sure, cand, ldw int, total int64) {
	ldw = cdiv(T, 32)
	cnt = rows * topkRadixBins * 4
	sure = cnt + rows*4
	cand = sure + rows*ldw*4
	return cnt, sure, cand, ldw, int64(cand + rows*ldw*4)
}

// TopKRadixScratchBytes is the scratch TopKRadix needs for rows rows of up
// to T scores; at least TopKWideScratchBytes(rows), so one buffer of this
// size serves either (one of them per buffer: each leaves the buffer as its
// own next call needs it).
func TopKRadixScratchBytes(rows, T int) int64 {
	_, _, _, _, n := topkRadixLayout(rows, T)
	return max(n, TopKWideScratchBytes(rows))
}

// TopKRadixHist is the histogram in a TopKRadix scratch that
// IndexerScoresMMA fills for TopKRadixAfterHist.
func TopKRadixHist(scratch cuda.DevPtr) cuda.DevPtr { return scratch }

// topkRadixPlan splits T scores into nb chunks of whole 1024-key tiles so
// that all rows together make about two blocks per SM.
func topkRadixPlan(sms, rows, T int) (nb, chunk int) {
	target := max(1, 2*max(1, sms)/rows)
	chunk = cdiv(cdiv(T, target), 1024) * 1024
	return cdiv(T, chunk), chunk
}

func topkRadixCheck(rows, T, K, ld, ldOut int, scratch cuda.DevPtr) error {
	if rows <= 0 || T <= 0 || K <= 0 || ld < T || ldOut < K || scratch == 0 {
		return errors.Newf("topk radix: rows=%d T=%d K=%d ld=%d ldOut=%d scratch=%#x", rows, T, K, ld, ldOut, uint64(scratch))
	}
	return nil
}

// TopKRadix is TopK (same arguments, same output) in two launches: a
// 12-bit histogram of the order-preserving keys over many blocks, then
// bitmaps of the keys above / inside the threshold's bin over many blocks,
// the last of which refines the threshold among that bin's keys and writes
// the selection in index order. scratch holds TopKRadixScratchBytes(rows,
// T) bytes, zeroed before its first use and left zeroed (graph replay
// safe), used by one call at a time.
func (k *Set) TopKRadix(s cuda.Stream, out, scores, lens, scratch cuda.DevPtr, rows, T, K, ld, ldOut int) error {
	return k.topkRadix(s, out, scores, lens, scratch, rows, T, K, ld, ldOut, true)
}

func (k *Set) topkRadix(s cuda.Stream, out, scores, lens, scratch cuda.DevPtr, rows, T, K, ld, ldOut int, smem bool) error {
	if err := topkRadixCheck(rows, T, K, ld, ldOut, scratch); err != nil {
		return err
	}
	nb, chunk := topkRadixPlan(k.c.Info().SMs, rows, T)
	if err := k.launch("topk_radix_hist", cuda.D3(nb, rows, 1), cuda.D1(256), 0, s, scores, ld, lens, T, K, chunk, TopKRadixHist(scratch)); err != nil {
		return err
	}
	return k.topkRadixAfterHist(s, out, scores, lens, scratch, rows, T, K, ld, ldOut, smem)
}

// TopKRadixAfterHist is TopKRadix's second launch, for scores whose
// histogram IndexerScoresMMA already built in scratch.
func (k *Set) TopKRadixAfterHist(s cuda.Stream, out, scores, lens, scratch cuda.DevPtr, rows, T, K, ld, ldOut int) error {
	return k.topkRadixAfterHist(s, out, scores, lens, scratch, rows, T, K, ld, ldOut, true)
}

// topkRadixCap is the threshold-bin keys the shared-memory final stage
// lists (more: it walks the bitmaps instead, same result);
// topkRadixMaxSmem bounds its dynamic shared memory (longer rows use the
// global-memory final stage).
const (
	topkRadixCap     = 4096
	topkRadixMaxSmem = 160 << 10
)

// topkRadixAfterHist launches topk_radix_mark_s (the final stage in shared
// memory) when smem and the row fits, else topk_radix_mark.
func (k *Set) topkRadixAfterHist(s cuda.Stream, out, scores, lens, scratch cuda.DevPtr, rows, T, K, ld, ldOut int, smem bool) error {
	if err := topkRadixCheck(rows, T, K, ld, ldOut, scratch); err != nil {
		return err
	}
	cnt, sure, cand, ldw, _ := topkRadixLayout(rows, T)
	nb, chunk := topkRadixPlan(k.c.Info().SMs, rows, T)
	args := []any{scores, ld, lens, T, K, chunk, TopKRadixHist(scratch), scratch.Add(int64(cnt)), scratch.Add(int64(sure)), scratch.Add(int64(cand)), ldw, out, ldOut}
	if dyn := 4 * (2*ldw + 2*topkRadixCap); smem && dyn <= topkRadixMaxSmem {
		f, err := k.fn("topk_radix_mark_s")
		if err != nil {
			return err
		}
		if _, ok := bigShared.Load(f); !ok {
			if err := k.c.SetMaxDynamicShared(f, topkRadixMaxSmem); err != nil {
				return err
			}
			bigShared.Store(f, true)
		}
		return k.launchFn(f, cuda.D3(nb, rows, 1), cuda.D1(1024), dyn, s, append(args, topkRadixCap)...)
	}
	return k.launch("topk_radix_mark", cuda.D3(nb, rows, 1), cuda.D1(1024), 0, s, args...)
}
