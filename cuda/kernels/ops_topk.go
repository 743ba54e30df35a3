package kernels

import (
	"os"
	"sync/atomic"

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
// histograms, counters, the two bitmaps, then topk_radix_mark_l's
// second-level histograms, candidate counters and candidate lists (16-byte
// aligned); it returns their offsets and the total bytes.
type topkRadixOffsets struct {
	cnt, sure, cand, l2, ccnt, list int
	ldw                             int // bitmap words per row
}

func topkRadixLayout(rows, T int) (topkRadixOffsets, int64) {
	var l topkRadixOffsets
	l.ldw = cdiv(T, 32)
	l.cnt = rows * topkRadixBins * 4
	l.sure = l.cnt + rows*4
	l.cand = l.sure + rows*l.ldw*4
	l.l2 = l.cand + rows*l.ldw*4
	l.ccnt = l.l2 + rows*1024*4
	l.list = cdiv(l.ccnt+rows*4, 16) * 16 // uint2 entries: 8-byte aligned (the scratch itself is 256-byte aligned)
	return l, int64(l.list + rows*T*8)
}

// TopKRadixScratchBytes is the scratch TopKRadix needs for rows rows of up
// to T scores; at least TopKWideScratchBytes(rows), so one buffer of this
// size serves either (one of them per buffer: each leaves the buffer as its
// own next call needs it).
func TopKRadixScratchBytes(rows, T int) int64 {
	_, n := topkRadixLayout(rows, T)
	return max(n, TopKWideScratchBytes(rows))
}

// TopKRadixHist is the histogram in a TopKRadix scratch that
// IndexerScoresMMA fills for TopKRadixAfterHist.
func TopKRadixHist(scratch cuda.DevPtr) cuda.DevPtr { return scratch }

// topkRadixPerSM is the mark blocks per SM topkRadixPlan aims for.
const topkRadixPerSM = 2

// topkRadixPlan splits T scores into nb chunks of whole 1024-key tiles so
// that all rows together make about two blocks per SM.
func topkRadixPlan(sms, rows, T int) (nb, chunk int) {
	target := max(1, topkRadixPerSM*max(1, sms)/rows)
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
	return k.topkRadix(s, out, scores, lens, scratch, rows, T, K, ld, ldOut, TopKRadixList)
}

// TopKRadixWith is TopKRadix with the final stage chosen.
func (k *Set) TopKRadixWith(s cuda.Stream, out, scores, lens, scratch cuda.DevPtr, rows, T, K, ld, ldOut int, final TopKRadixFinal) error {
	return k.topkRadix(s, out, scores, lens, scratch, rows, T, K, ld, ldOut, final)
}

func (k *Set) topkRadix(s cuda.Stream, out, scores, lens, scratch cuda.DevPtr, rows, T, K, ld, ldOut int, final TopKRadixFinal) error {
	if err := topkRadixCheck(rows, T, K, ld, ldOut, scratch); err != nil {
		return err
	}
	nb, chunk := topkRadixPlan(k.c.Info().SMs, rows, T)
	if err := k.launch("topk_radix_hist", cuda.D3(nb, rows, 1), cuda.D1(256), 0, s, scores, ld, lens, T, K, chunk, TopKRadixHist(scratch)); err != nil {
		return err
	}
	return k.TopKRadixAfterHistWith(s, out, scores, lens, scratch, rows, T, K, ld, ldOut, final)
}

// TopKRadixAfterHist is TopKRadix's second launch, for scores whose
// histogram IndexerScoresMMA already built in scratch.
func (k *Set) TopKRadixAfterHist(s cuda.Stream, out, scores, lens, scratch cuda.DevPtr, rows, T, K, ld, ldOut int) error {
	return k.TopKRadixAfterHistWith(s, out, scores, lens, scratch, rows, T, K, ld, ldOut, TopKRadixList)
}

// TopKRadixFinal picks how the last block of a row finds the threshold
// among its 12-bit bin's keys (the same selection either way).
type TopKRadixFinal int

const (
	// TopKRadixList: the mark blocks append the bin's keys to a list and
	// a second-level histogram (topk_radix_mark_l; the default).
	TopKRadixList TopKRadixFinal = iota
	// TopKRadixBitmaps: candidate bitmaps staged in shared memory, the
	// keys gathered once when at most topkRadixCap (topk_radix_mark_s).
	TopKRadixBitmaps
	// TopKRadixGlobal: the bitmaps walked in global memory (topk_radix_mark).
	TopKRadixGlobal
	// TopKRadixOne: rows of at most TopKRadixOneMaxT keys in one block
	// each (topk_radix_one_w*: keys in registers, the three radix digits
	// and the ordered emit without leaving the block); longer rows take
	// TopKRadixListW (TopKListW, the default) or TopKRadixList.
	TopKRadixOne
	// TopKRadixListW: topk_radix_mark_l's selection on
	// topk_radix_mark_lw (one-warp digit picks, the third digit's pass
	// skipped when the second is taken whole).
	TopKRadixListW
)

// TopKListW (TILERT_GPU_TOPK_LW=0 turns it off) runs the rows that
// TopKRadixOne leaves to the mark blocks (over TopKRadixOneMaxT keys) on
// topk_radix_mark_lw instead of topk_radix_mark_l: the same selection with
// a shorter chain in the mark blocks' bin search and the last block's
// final stage. An explicit TopKRadixList keeps mark_l. H200, session 26
// (docs/measured/h200-2026-12-04-s26), graph-timed at 131072 keys: the
// top-k alone 12.02 us against 17.89, the scores + top-k pair 20.80
// against 26.28; the step at 131072 (9 MoE layers, 1 slot) 10 us faster on
// both models, 18 us with the q chain forked before the scores (TILERT_GPU_SIDE_Q_AT=scores).
var TopKListW = os.Getenv("TILERT_GPU_TOPK_LW") != "0"

// TopKListWLaunches counts topk_radix_mark_lw launches (tests).
var TopKListWLaunches atomic.Int64

// TopKRadixOneMaxT is the longest row TopKRadixOne selects in one block
// (1024 threads x 32 keys in registers).
const TopKRadixOneMaxT = 1024 * 32

// TopKOneW12 makes TopKRadixOne's rows in buckets of 8193..12288 keys run
// topk_radix_one_w12 (12 keys a thread, every row length on the 12-key
// body) instead of topk_radix_one_w16 (16 a thread on the rows past 8192
// keys, so 516 of the 1024 threads hold keys there). The engine's 8192-token
// rows plus what they generated sit in an 8448-key bucket: the one-block
// top-k on the attention front's critical path (GLM-5 dims, 8192: 9.4 us
// after the scores in session 30's trace). The same selection, index for
// index. The default since session 38 (H100, 3 MoE layers, 8192, A/B/A/B:
// GLM-5 dims -13 / -10 us a step, DeepSeek-V3.2 dims 0 / -2, GLM-5 at
// 131072 -1 / -2); the engine's TILERT_GPU_TOPK_W12=0 turns it off.
var TopKOneW12 = true

// topkRadixOneKernel is the topk_radix_one_w kernel whose keys per thread
// cover T (8, 16 or 32; 12 with TopKOneW12).
func topkRadixOneKernel(T int) string {
	switch {
	case T <= 1024*8:
		return "topk_radix_one_w8"
	case TopKOneW12 && T <= 1024*12:
		return "topk_radix_one_w12"
	case T <= 1024*16:
		return "topk_radix_one_w16"
	}
	return "topk_radix_one_w32"
}

// topkRadixCap is the threshold-bin keys the shared-memory final stage
// lists (more: it walks the bitmaps instead, same result);
// topkRadixMaxSmem bounds its dynamic shared memory (longer rows use the
// global-memory final stage).
const (
	topkRadixCap     = 4096
	topkRadixMaxSmem = 160 << 10
)

// TopKRadixAfterHistWith is TopKRadixAfterHist with the final stage
// chosen (rows too long for a shared-memory stage use TopKRadixGlobal).
func (k *Set) TopKRadixAfterHistWith(s cuda.Stream, out, scores, lens, scratch cuda.DevPtr, rows, T, K, ld, ldOut int, final TopKRadixFinal) error {
	if err := topkRadixCheck(rows, T, K, ld, ldOut, scratch); err != nil {
		return err
	}
	l, _ := topkRadixLayout(rows, T)
	nb, chunk := topkRadixPlan(k.c.Info().SMs, rows, T)
	hist, cnt, sure := TopKRadixHist(scratch), scratch.Add(int64(l.cnt)), scratch.Add(int64(l.sure))
	name, dyn := "", 0
	var args []any
	if final == TopKRadixOne && T <= TopKRadixOneMaxT {
		return k.launch(topkRadixOneKernel(T), cuda.D1(rows), cuda.D1(1024), 0, s, scores, ld, lens, T, K, hist, out, ldOut)
	}
	if TopKListW && final == TopKRadixOne {
		final = TopKRadixListW
	}
	switch {
	case (final == TopKRadixList || final == TopKRadixOne || final == TopKRadixListW) && 4*2*l.ldw <= topkRadixMaxSmem:
		name, dyn = "topk_radix_mark_l", 4*2*l.ldw
		if final == TopKRadixListW {
			name = "topk_radix_mark_lw"
			TopKListWLaunches.Add(1)
		}
		args = []any{scores, ld, lens, T, K, chunk, hist, cnt, sure, l.ldw, scratch.Add(int64(l.l2)), scratch.Add(int64(l.ccnt)),
			scratch.Add(int64(l.list)), T, out, ldOut}
	case final != TopKRadixGlobal && 4*(2*l.ldw+2*topkRadixCap) <= topkRadixMaxSmem:
		name, dyn = "topk_radix_mark_s", 4*(2*l.ldw+2*topkRadixCap)
		args = []any{scores, ld, lens, T, K, chunk, hist, cnt, sure, scratch.Add(int64(l.cand)), l.ldw, out, ldOut, topkRadixCap}
	default:
		return k.launch("topk_radix_mark", cuda.D3(nb, rows, 1), cuda.D1(1024), 0, s,
			scores, ld, lens, T, K, chunk, hist, cnt, sure, scratch.Add(int64(l.cand)), l.ldw, out, ldOut)
	}
	f, err := k.fn(name)
	if err != nil {
		return err
	}
	if _, ok := bigShared.Load(f); !ok {
		if err := k.c.SetMaxDynamicShared(f, topkRadixMaxSmem); err != nil {
			return err
		}
		bigShared.Store(f, true)
	}
	return k.launchFn(f, cuda.D3(nb, rows, 1), cuda.D1(1024), dyn, s, args...)
}
