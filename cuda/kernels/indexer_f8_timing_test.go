package kernels

import (
	"math/rand/v2"
	"testing"

	"github.com/tilert-go/tilert/cuda"
)

// TestKernelTimingIdxF8: indexer_scores_mma_pf against indexer_scores_f8
// and indexer_scores_wg (sm_90a) graph-timed (graphUsRot, TestKernelTimingIdxMLA's style: cold keys over 4
// copies), the scores + histogram alone (memset subtracted) and the pair
// with the top-k the engine runs after them (topk_radix_one up to
// TopKRadixOneMaxT keys, topk_radix_mark_l above), 1 and 4 rows at 8192,
// 32768 and 131072 keys. Reported, never asserted (TILERT_GPU_TIMING=1).
func TestKernelTimingIdxF8(t *testing.T) {
	needTiming(t)
	onGPU(t, func(c *cuda.Ctx, k *Set, a *allocs, r *rand.Rand) {
		if !k.IndexerMMASupported() {
			t.Skip("indexer mma unsupported")
		}
		s := c.Stream()
		add := timingTable(t, c, a, r, 256<<20, "device-to-device copy 256 MiB (read+write)", "reference of this table")
		const H, K = 64, 2048
		img := randIndexerCache(r, 64)
		q, w := a.up(randF32(r, 4*H*128, 1)), a.up(randF32(r, 4*H, 1))
		pos := a.up([]int32{100, 200, 300, 400})
		cosT, sinT := a.up(randF32(r, 1024*32, 1)), a.up(randF32(r, 1024*32, 1))
		qh, wq := a.raw(4*IndexerQRowBytes), a.raw(4*4*IndexerQHeads)
		chk(k.IndexerQPrep(s, qh, wq, q, w, pos, cosT, sinT, 4, H, 64, false, 0.011))
		type scoresFn func(s cuda.Stream, out, qh, wq, cache, blockTable, lens, hist cuda.DevPtr, nq, T, ldOut int) error
		kernels := []struct {
			name string
			f    scoresFn
		}{{"indexer_scores_mma_pf", k.IndexerScoresMMA}, {"indexer_scores_f8", k.IndexerScoresF8}}
		if err := k.WGSupported(); err == nil {
			kernels = append(kernels, struct {
				name string
				f    scoresFn
			}{"indexer_scores_wg", k.IndexerScoresWG})
		} else {
			t.Logf("indexer_scores_wg not timed: %v", err)
		}
		for _, T := range []int{8192, 32768, 131072} {
			nPages := T / 64
			const copies = 4
			caches := make([]cuda.DevPtr, copies)
			for i := range caches {
				caches[i] = a.raw(int64(nPages * IndexerPageBytes))
				for p := 0; p < nPages; p += 64 {
					chk(c.Upload(caches[i].Add(int64(p*IndexerPageBytes)), img))
				}
			}
			kb := float64(nPages*IndexerPageBytes + 4*T)
			final := TopKRadixOne
			if T > TopKRadixOneMaxT {
				final = TopKRadixList
			}
			for _, M := range []int{1, 4} {
				ls := make([]int32, M)
				for i := range ls {
					ls[i] = int32(T - 37*i)
				}
				lens := a.up(ls)
				out := a.raw(int64(4 * M * T))
				idx := a.raw(int64(4 * M * K))
				scratch := a.up(make([]byte, TopKRadixScratchBytes(M, T)))
				usz := graphUsRot(c, s, 8, 15, func(int) {
					chk(c.MemsetD32(TopKRadixHist(scratch), 0, int64(M*topkRadixBins), s))
				})
				for _, kn := range kernels {
					us := graphUsRot(c, s, 8, 15, func(i int) {
						chk(kn.f(s, out, qh, wq, caches[i%copies], 0, lens, TopKRadixHist(scratch), M, T, T))
						chk(c.MemsetD32(TopKRadixHist(scratch), 0, int64(M*topkRadixBins), s))
					})
					add(fmtName("graph: %s+hist rows=%d T=%d", kn.name, M, T), float64(M)*kb, us-usz, "cold keys (4 copies); memset subtracted")
					us = graphUsRot(c, s, 8, 15, func(i int) {
						chk(kn.f(s, out, qh, wq, caches[i%copies], 0, lens, TopKRadixHist(scratch), M, T, T))
						chk(k.TopKRadixAfterHistWith(s, idx, out, lens, scratch, M, T, K, T, K, final))
					})
					add(fmtName("graph: %s+hist, topk after hist rows=%d T=%d", kn.name, M, T), float64(M)*kb, us, "the engine's pair")
				}
			}
		}
	})
}
