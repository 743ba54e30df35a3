package kernels

import (
	"math/rand/v2"
	"testing"

	"github.com/tilert-go/tilert/cuda"
)

// GPU checks of topk_radix_one_w (TopKRadixOne's kernel) against the CPU
// reference refTopK element for element, and its timing
// (TILERT_GPU_TIMING=1). They skip without a GPU; topk_one_pure_test.go
// checks the same logic on the CPU.

// topkOneRows draws rows rows of T scores of dist: tkwRow over each row's
// length (lens[row], or T without lens), then the rest of the row drawn
// alike (never read).
func topkOneRows(r *rand.Rand, dist string, rows, T, K int, lens []int32) []float32 {
	x := make([]float32, 0, rows*T)
	for row := range rows {
		n := T
		if lens != nil {
			n = min(T, int(lens[row]))
		}
		x = append(x, tkwRow(r, dist, n, K)...)
		x = append(x, tkwRow(r, dist, T-n, K)...)
	}
	return x
}

// TestKernelTopKOneW: the one-block top-k after topk_radix_hist's histogram,
// topk_radix_one_w against refTopK: normal, offset, 64-value ties, one 12-bit bin (narrow,
// and distinct keys there: the third digit decides), every key equal, exactly
// K keys in a higher bin (split: no digit pass), keys spread over ~1600 bins
// (small bin), rows shorter than K (-1 padding), lengths not a multiple of
// 32, rows of different lengths in one launch, the 8192-key row in its
// 8448-key bucket (the KPT / 2 body), rows past it (the 3 KPT / 4 body), K 2048 and 64, 1 to 8 rows, a row
// pitch off the 16-byte grid. Each case runs twice on one scratch (the
// histogram must be left zeroed: checked, and the repeat must match). Then
// the engine's pair: indexer_scores_mma's fused histogram, then the kernel.
func TestKernelTopKOneW(t *testing.T) {
	onGPU(t, func(c *cuda.Ctx, k *Set, a *allocs, r *rand.Rand) {
		s := c.Stream()
		// The cases once as the launcher picks, then those in buckets of
		// 8193..12288 keys again on topk_radix_one_w12 (TopKOneW12).
		for _, w12 := range []bool{false, true} {
			withTopKOneW12(t, w12)
			for _, cs := range []struct {
				dist    string
				rows, T int
				K       int
				lens    []int32
				ld      int // row pitch of the scores (0: T)
			}{
				{"normal", 1, 8192, 2048, nil, 0},
				{"normal", 1, 8448, 2048, []int32{8192}, 0},
				// Rows past 8192 keys in the 8448-key bucket and up to 12288
				// (topk_radix_one_w12 under TopKOneW12).
				{"normal", 2, 8448, 2048, []int32{8256, 8193}, 0},
				{"ties", 2, 12288, 2048, []int32{12288, 10001}, 0},
				{"narrow", 2, 12288, 2048, []int32{9000, 2100}, 0},
				{"split", 1, 8448, 2048, []int32{8300}, 0},
				{"normal", 3, 8448, 64, []int32{8448, 65, 100}, 0},
				{"normal", 2, 12288, 2048, []int32{12288, 8500}, 12288 + 5},
				{"normal", 4, 8192, 2048, []int32{8192, 8000, 2049, 2048}, 0},
				{"ties", 8, 8192, 2048, []int32{8192, 2047, 2048, 2049, 8191, 100, 5000, 7}, 0},
				{"narrow", 2, 16384, 2048, []int32{16384, 9000}, 0},
				{"distinct narrow", 2, 32768, 2048, []int32{32768, 8193}, 0},
				{"equal", 1, 5000, 2048, nil, 0},
				{"equal", 2, 32768, 2048, []int32{32768, 30001}, 0},
				{"split", 3, 16384, 2048, []int32{16384, 12345, 4097}, 0},
				{"small bin", 2, 32768, 2048, []int32{32768, 8192}, 0},
				{"offset", 3, 32768, 2048, []int32{32768, 32767, 20000}, 0},
				{"ties", 2, 32768, 2048, nil, 0},
				{"normal", 1, 2049, 2048, nil, 0},
				{"normal", 2, 1500, 2048, nil, 0},
				{"normal", 3, 8192, 64, []int32{8192, 100, 65}, 0},
				{"ties", 2, 4000, 64, []int32{3001, 64}, 0},
				// A row pitch off the 16-byte grid (slot rows: the scalar key loads).
				{"normal", 3, 16384, 2048, []int32{16384, 8192, 10000}, 16384 + 5},
			} {
				if w12 && (cs.T <= 1024*8 || cs.T > 1024*12) {
					continue
				}
				ld := cs.T
				if cs.ld != 0 {
					ld = cs.ld
				}
				x := topkOneRows(r, cs.dist, cs.rows, ld, cs.K, cs.lens)
				lp := cuda.DevPtr(0)
				if cs.lens != nil {
					lp = a.up(cs.lens)
				}
				xp := a.up(x)
				scratch := a.up(make([]byte, TopKRadixScratchBytes(cs.rows, cs.T)))
				name := fmtName("%s %s rows=%d T=%d K=%d lens=%v ld=%d", topkRadixOneKernel(cs.T), cs.dist, cs.rows, cs.T, cs.K, cs.lens, ld)
				var first []int32
				for rep := range 2 {
					op := a.poisoned(cs.rows * cs.K)
					chk(k.topkRadix(s, op, xp, lp, scratch, cs.rows, cs.T, cs.K, ld, cs.K, TopKRadixOne))
					got := downI32(c, op, cs.rows*cs.K)
					hist := downI32(c, TopKRadixHist(scratch), cs.rows*topkRadixBins)
					left := 0
					for _, h := range hist {
						if h != 0 {
							left++
						}
					}
					mism := 0
					for row := range cs.rows {
						n := cs.T
						if cs.lens != nil {
							n = int(cs.lens[row])
						}
						want := refTopK(x[row*ld:row*ld+cs.T], n, cs.K)
						for j := range cs.K {
							if got[row*cs.K+j] != want[j] {
								mism++
							}
						}
					}
					tag := name
					if rep == 1 {
						tag += " (scratch reused)"
						diff := 0
						for j := range first {
							if first[j] != got[j] {
								diff++
							}
						}
						record(t, tag+" repeat", "mismatched indices", float64(diff), 0)
					}
					first = got
					record(t, tag+" vs CPU", "mismatched indices", float64(mism), 0)
					record(t, tag+" histogram left zeroed", "nonzero bins", float64(left), 0)
				}
			}
		}
		withTopKOneW12(t, false)
		if k.IndexerMMASupported() {
			topkOnePairCheck(t, c, k, a, r, s)
		}
	})
}

// indexerQRows4 prepares 4 random indexer query rows of 64 heads
// (IndexerQPrep at positions 100..400) and returns their codes and weights.
func indexerQRows4(k *Set, a *allocs, r *rand.Rand, s cuda.Stream) (qh, wq cuda.DevPtr) {
	const H = 64
	q, w := a.up(randF32(r, 4*H*128, 1)), a.up(randF32(r, 4*H, 1))
	pos := a.up([]int32{100, 200, 300, 400})
	cosT, sinT := a.up(randF32(r, 1024*32, 1)), a.up(randF32(r, 1024*32, 1))
	qh, wq = a.raw(4*IndexerQRowBytes), a.raw(4*4*IndexerQHeads)
	chk(k.IndexerQPrep(s, qh, wq, q, w, pos, cosT, sinT, 4, H, 64, false, 0.011))
	return qh, wq
}

// indexerScores4 prepares 4 indexer query rows (64 heads, random) against a
// random fp8 key cache of T keys and returns a function that scores them
// with indexer_scores_mma for the rows' lens, building its fused histogram
// in hist, into the returned 4 x T float32 scores (the engine's pair's
// first launch).
func indexerScores4(c *cuda.Ctx, k *Set, a *allocs, r *rand.Rand, s cuda.Stream, T int, lens cuda.DevPtr) func(hist cuda.DevPtr) cuda.DevPtr {
	img := randIndexerCache(r, 64)
	qh, wq := indexerQRows4(k, a, r, s)
	nPages := cdiv(cdiv(T, 64), 64) * 64
	cache := a.raw(int64(nPages * IndexerPageBytes))
	for p := 0; p < nPages; p += 64 {
		chk(c.Upload(cache.Add(int64(p*IndexerPageBytes)), img))
	}
	sc := a.raw(int64(4 * 4 * T))
	return func(hist cuda.DevPtr) cuda.DevPtr {
		chk(k.IndexerScoresMMA(s, sc, qh, wq, cache, 0, lens, hist, 4, T, T))
		return sc
	}
}

// topkOnePairCheck: indexer_scores_mma with the fused histogram, then
// TopKRadixAfterHistWith(TopKRadixOne), 4 rows in an 8448-key bucket (the
// engine's 8192-key context), against refTopK of the scores.
func topkOnePairCheck(t *testing.T, c *cuda.Ctx, k *Set, a *allocs, r *rand.Rand, s cuda.Stream) {
	const T, K = 8448, 2048
	ls := []int32{8192, 8192 - 37, 3000, 1000}
	lens := a.up(ls)
	scratch := a.up(make([]byte, TopKRadixScratchBytes(4, T)))
	op := a.poisoned(4 * K)
	score := indexerScores4(c, k, a, r, s, T, lens)
	sc := score(TopKRadixHist(scratch))
	chk(k.TopKRadixAfterHistWith(s, op, sc, lens, scratch, 4, T, K, T, K, TopKRadixOne))
	got := downI32(c, op, 4*K)
	x := downF32(c, sc, 4*T)
	mism := 0
	for row, n := range ls {
		want := refTopK(x[row*T:(row+1)*T], int(n), K)
		for j := range K {
			if got[row*K+j] != want[j] {
				mism++
			}
		}
	}
	record(t, "topk_radix_one_w after indexer_scores_mma's histogram (4 rows, T=8448) vs CPU", "mismatched indices", float64(mism), 0)
}

// TestKernelTimingTopKOne (TILERT_GPU_TIMING=1): the one-block top-k,
// topk_radix_one_w, graph-timed (graphUsRot: 8 calls a graph, the median of
// 15 replays, microseconds a call). Each call is topk_radix_hist (the
// histogram the kernel reads and zeroes) then the kernel; the histogram
// launch alone is timed too, and the kernel's row says the difference.
// Normal scores, K = 2048, rows of n = 2049, 8192, 16384, 32768 keys
// (T = n) and 8192 keys in an 8448-key bucket (the engine's 8192-token
// context: the KPT / 2 body), 1 and 4 rows. Then the engine's pair
// (indexer_scores_mma with the fused histogram, then the kernel) at 8192
// keys in the 8448 bucket and at T = 8192.
func TestKernelTimingTopKOne(t *testing.T) {
	needTiming(t)
	onGPU(t, func(c *cuda.Ctx, k *Set, a *allocs, r *rand.Rand) {
		s := c.Stream()
		add := timingTable(t, c, a, r, 64<<20, "device-to-device copy 64 MiB (read+write)", "reference of this table")
		const K = 2048
		for _, sh := range []struct{ T, n int }{{2049, 2049}, {8192, 8192}, {8448, 8192}, {16384, 16384}, {32768, 32768}} {
			for _, M := range []int{1, 4} {
				ls := make([]int32, M)
				for i := range ls {
					ls[i] = int32(sh.n)
				}
				x := topkOneRows(r, "normal", M, sh.T, K, ls)
				xp, lp := a.up(x), a.up(ls)
				idx := a.raw(int64(4 * M * K))
				scratch := a.up(make([]byte, TopKRadixScratchBytes(M, sh.T)))
				nb, chunk := topkRadixPlan(k.c.Info().SMs, M, sh.T)
				hist := func() {
					chk(k.launch("topk_radix_hist", cuda.D3(nb, M, 1), cuda.D1(256), 0, s, xp, sh.T, lp, sh.T, K, chunk, TopKRadixHist(scratch)))
				}
				base := graphUsRot(c, s, 8, 15, func(int) { hist() })
				// The histogram alone accumulated over the replays: clear it.
				chk(c.MemsetD32(TopKRadixHist(scratch), 0, int64(M*topkRadixBins), s))
				add(fmtName("graph: topk_radix_hist rows=%d n=%d T=%d", M, sh.n, sh.T), float64(4*M*sh.n), base, "the histogram launch alone")
				us := graphUsRot(c, s, 8, 15, func(int) {
					hist()
					chk(k.TopKRadixAfterHistWith(s, idx, xp, lp, scratch, M, sh.T, K, sh.T, K, TopKRadixOne))
				})
				add(fmtName("graph: hist + topk_radix_one_w rows=%d n=%d T=%d", M, sh.n, sh.T), float64(4*M*sh.n), us,
					fmtName("%s: %.2f us after the histogram launch", topkRadixOneKernel(sh.T), us-base))
			}
		}
		if k.IndexerMMASupported() {
			timeTopKOnePair(c, k, a, r, s, add)
		}
	})
}

// timeTopKOnePair: the engine's pair, indexer_scores_mma (+ histogram) then
// the one-block top-k (topk_radix_one_w), and the scores alone
// (their histogram cleared by a memset, timed apart and subtracted), keys
// rotating over 4 cache copies.
func timeTopKOnePair(c *cuda.Ctx, k *Set, a *allocs, r *rand.Rand, s cuda.Stream, add func(string, float64, float64, string)) {
	const H, K, copies = 64, 2048, 4
	img := randIndexerCache(r, 64)
	qh, wq := indexerQRows4(k, a, r, s)
	for _, T := range []int{8448, 8192} {
		nPages := cdiv(cdiv(T, 64), 64) * 64
		caches := make([]cuda.DevPtr, copies)
		for i := range caches {
			caches[i] = a.raw(int64(nPages * IndexerPageBytes))
			for p := 0; p < nPages; p += 64 {
				chk(c.Upload(caches[i].Add(int64(p*IndexerPageBytes)), img))
			}
		}
		kb := float64(cdiv(T, 64)*IndexerPageBytes + 4*T)
		for _, M := range []int{1, 4} {
			ls := make([]int32, M)
			for i := range ls {
				ls[i] = int32(8192 - 37*i)
			}
			lens := a.up(ls)
			out := a.raw(int64(4 * M * T))
			idx := a.raw(int64(4 * M * K))
			scratch := a.up(make([]byte, TopKRadixScratchBytes(M, T)))
			us := graphUsRot(c, s, 8, 15, func(i int) {
				chk(k.IndexerScoresMMA(s, out, qh, wq, caches[i%copies], 0, lens, TopKRadixHist(scratch), M, T, T))
				chk(c.MemsetD32(TopKRadixHist(scratch), 0, int64(M*topkRadixBins), s))
			})
			usz := graphUsRot(c, s, 8, 15, func(int) {
				chk(c.MemsetD32(TopKRadixHist(scratch), 0, int64(M*topkRadixBins), s))
			})
			scores := us - usz
			add(fmtName("graph: indexer_scores_mma+hist rows=%d T=%d", M, T), float64(M)*kb, scores, "cold keys (4 copies); memset subtracted")
			pair := graphUsRot(c, s, 8, 15, func(i int) {
				chk(k.IndexerScoresMMA(s, out, qh, wq, caches[i%copies], 0, lens, TopKRadixHist(scratch), M, T, T))
				chk(k.TopKRadixAfterHistWith(s, idx, out, lens, scratch, M, T, K, T, K, TopKRadixOne))
			})
			add(fmtName("graph: scores+hist, topk_radix_one_w rows=%d lens 8192.. T=%d", M, T), float64(M)*kb, pair,
				fmtName("the engine's pair; %.2f us after the scores", pair-scores))
		}
	}
}
