package kernels

// indexer_scores_wgh (cu/wg/scores_wgh.cu, the sm_90a module) on the GPU,
// fresh random inputs: against the float64 score of the quantised query
// and keys, against indexer_scores_mma_pf (the same function, another
// summation order), the -inf tail and the columns past T untouched, the
// histogram (the radix top-k after it equals the CPU's top-k of the
// kernel's own scores, twice on one scratch, which is left zeroed), the
// rows launch against one launch per row bit for bit, and bad arguments.
// Timing beside _pf: TestKernelTimingIdxWGH.

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/tilert-go/tilert/cuda"
)

// refIndexerScoresQ is the scores' formula in float64 from the codes the
// kernels read: score[t] = ks[t] * sum_h wq[h] * relu(sum_d q8[h][d] k8[t][d]).
func refIndexerScoresQ(qh []byte, wq []float32, cache []byte, bt []int32, n, T int) []float64 {
	const D = IndexerHeadDim
	q := make([]float64, IndexerQHeads*D)
	for h := range IndexerQHeads {
		for d := range D {
			q[h*D+d] = fp8Table[qh[IndexerQByte(h, d)]]
		}
	}
	ref := make([]float64, T)
	k := make([]float64, D)
	for t := range T {
		if t >= n {
			ref[t] = math.Inf(-1)
			continue
		}
		pgi := t / IndexerPageTokens
		if bt != nil {
			pgi = int(bt[pgi])
		}
		pg := cache[pgi*IndexerPageBytes:]
		for d := range D {
			k[d] = fp8Table[pg[(t%IndexerPageTokens)*D+d]]
		}
		var s float64
		for h := range IndexerQHeads {
			var dot float64
			for d := range D {
				dot += q[h*D+d] * k[d]
			}
			s += float64(wq[h]) * math.Max(0, dot)
		}
		ref[t] = s * float64(getF32(pg[IndexerPageTokens*D+4*(t%IndexerPageTokens):]))
	}
	return ref
}

// bitMismatches counts the entries of a and b whose bits differ.
func bitMismatches(a, b []float32) int {
	n := 0
	for i := range a {
		if math.Float32bits(a[i]) != math.Float32bits(b[i]) {
			n++
		}
	}
	return n
}

// selMismatches counts the indices of sel (rows of K) that differ from the
// CPU's top-K of each row of scores (rows of ld, T keys, lens[m] valid).
func selMismatches(sel []int32, scores []float32, lens []int32, ld, T, K int) int {
	n := 0
	for m := range lens {
		want := refTopK(scores[m*ld:m*ld+T], int(lens[m]), K)
		for j := range K {
			if sel[m*K+j] != want[j] {
				n++
			}
		}
	}
	return n
}

func TestKernelIndexerWGH(t *testing.T) {
	onGPU(t, func(c *cuda.Ctx, k *Set, a *allocs, r *rand.Rand) {
		needWG(t, c, k)
		s := c.Stream()
		cosT, sinT := a.up(randF32(r, 4096*32, 1)), a.up(randF32(r, 4096*32, 1))
		before := IndexerWGHLaunches.Load()
		for _, cs := range []struct {
			name  string
			H, T  int
			lens  []int32
			paged bool
			ref   bool // float64 reference (else against _pf only)
		}{
			{"H=64 T=1000 paged", 64, 1000, []int32{1000, 963, 100, 0, 40}, true, true},
			{"H=20 T=300", 20, 300, []int32{300, 17}, false, true},
			{"H=64 T=8256 (the engine's 8192 bucket)", 64, 8256, []int32{8192}, false, true},
			{"H=64 T=65836 paged", 64, 65836, []int32{65836, 65000}, true, true},
			{"H=64 T=131072", 64, 131072, []int32{131072, 131000, 70000}, false, false},
		} {
			M := len(cs.lens)
			q, w := a.up(randF32(r, M*cs.H*IndexerHeadDim, 1)), a.up(randF32(r, M*cs.H, 1))
			ps := make([]int32, M)
			for i := range ps {
				ps[i] = int32(r.IntN(4096))
			}
			qh, wq := a.raw(int64(M*IndexerQRowBytes)), a.raw(int64(4*M*IndexerQHeads))
			chk(k.IndexerQPrep(s, qh, wq, q, w, a.up(ps), cosT, sinT, M, cs.H, 64, false, 0.011))
			qhH := make([]byte, M*IndexerQRowBytes)
			chk(c.Download(qhH, qh))
			wqH := downF32(c, wq, M*IndexerQHeads)
			cacheH, bt, btp := randIndexerKeys(r, a, cs.T, cs.paged)
			cache := a.up(cacheH)
			lens := a.up(cs.lens)
			ld := cs.T + 3
			out := a.poisoned(M * ld)
			chk(k.IndexerScoresWGH(s, out, qh, wq, cache, btp, lens, 0, M, cs.T, ld))
			got := downF32(c, out, M*ld)
			pfo := a.poisoned(M * ld)
			chk(k.IndexerScoresMMA(s, pfo, qh, wq, cache, btp, lens, 0, M, cs.T, ld))
			pf := downF32(c, pfo, M*ld)
			var gotV []float32
			var ref, pfRef []float64
			tail := 0
			for m := range M {
				row := got[m*ld : (m+1)*ld]
				for i := cs.T; i < ld; i++ {
					if math.Float32bits(row[i]) != 0x7fc00000 {
						tail++ // written past T
					}
				}
				for i := int(cs.lens[m]); i < cs.T; i++ {
					if !math.IsInf(float64(row[i]), -1) {
						tail++
					}
				}
				gotV = append(gotV, row[:cs.T]...)
				for _, v := range pf[m*ld : m*ld+cs.T] {
					pfRef = append(pfRef, float64(v))
				}
				if cs.ref {
					ref = append(ref, refIndexerScoresQ(qhH[m*IndexerQRowBytes:(m+1)*IndexerQRowBytes], wqH[m*IndexerQHeads:(m+1)*IndexerQHeads], cacheH, bt, int(cs.lens[m]), cs.T)...)
				}
			}
			record(t, "indexer_scores_wgh "+cs.name+": -inf tail, nothing past T", "wrong entries", float64(tail), 0)
			if cs.ref {
				record(t, "indexer_scores_wgh "+cs.name, relMetric, relErr(gotV, ref), boundF32)
			}
			record(t, "indexer_scores_wgh vs indexer_scores_mma_pf "+cs.name, relMetric, relErr(gotV, pfRef), boundF32)
			// The histogram: the same scores, and the radix top-k after it
			// selects the CPU's top-k of them (twice on one scratch).
			K := min(2048, cs.T/2)
			scratch := a.up(make([]byte, TopKRadixScratchBytes(M, cs.T)))
			for rep := range 2 {
				oh := a.poisoned(M * ld)
				chk(k.IndexerScoresWGH(s, oh, qh, wq, cache, btp, lens, TopKRadixHist(scratch), M, cs.T, ld))
				gh := downF32(c, oh, M*ld)
				sel := a.poisoned(M * K)
				chk(k.TopKRadixAfterHist(s, sel, oh, lens, scratch, M, cs.T, K, ld, K))
				bad := bitMismatches(gh, got) + selMismatches(downI32(c, sel, M*K), gh, cs.lens, ld, cs.T, K)
				record(t, fmtName("indexer_scores_wgh+hist, topk_radix after hist K=%d %s (call %d)", K, cs.name, rep+1),
					"mismatched scores/indices", float64(bad), 0)
			}
			hist := make([]uint32, M*topkRadixBins)
			chk(c.Download(hist, TopKRadixHist(scratch)))
			left := 0
			for _, v := range hist {
				if v != 0 {
					left++
				}
			}
			record(t, "indexer_scores_wgh "+cs.name+": histogram left zeroed by the top-k", "nonzero bins", float64(left), 0)
			// Two warpgroups a block (IndexerScoresWGH2): the same scores bit
			// for bit (tail and columns past T included), its histogram
			// feeding the same selection.
			{
				o2 := a.poisoned(M * ld)
				sc2 := a.up(make([]byte, TopKRadixScratchBytes(M, cs.T)))
				chk(k.IndexerScoresWGH2(s, o2, qh, wq, cache, btp, lens, TopKRadixHist(sc2), M, cs.T, ld))
				sel := a.poisoned(M * K)
				chk(k.TopKRadixAfterHist(s, sel, o2, lens, sc2, M, cs.T, K, ld, K))
				bad := bitMismatches(downF32(c, o2, M*ld), got) + selMismatches(downI32(c, sel, M*K), got, cs.lens, ld, cs.T, K)
				record(t, "indexer_scores_wgh2 (two warpgroups a block) vs wgh "+cs.name+", +hist, topk after hist", "mismatched scores/indices", float64(bad), 0)
			}
		}
		// Rows of 3 caches in one launch against one launch per row.
		{
			const H, M = 64, 3
			const T = 8192 + 64*7
			q, w := a.up(randF32(r, M*H*128, 1)), a.up(randF32(r, M*H, 1))
			qh, wq := a.raw(M*IndexerQRowBytes), a.raw(4*M*IndexerQHeads)
			chk(k.IndexerQPrep(s, qh, wq, q, w, a.up([]int32{100, 200, 300}), cosT, sinT, M, H, 64, false, 0.011))
			caches := make([]cuda.DevPtr, M)
			for i := range caches {
				caches[i] = a.up(randIndexerCache(r, T/IndexerPageTokens+2))
			}
			ls := []int32{T, T - 100, 3000}
			lens := a.up(ls)
			const off = 2 * IndexerPageBytes
			bases := rowBases(a, caches, off)
			ld := T + 5
			out := a.poisoned(M * ld)
			chk(k.IndexerScoresWGHRows(s, out, qh, wq, off, bases, lens, 0, M, T, ld))
			got := downF32(c, out, M*ld)
			bad := 0
			for m := range M {
				o1 := a.poisoned(ld)
				chk(k.IndexerScoresWGH(s, o1, qh.Add(int64(m*IndexerQRowBytes)), wq.Add(int64(4*m*IndexerQHeads)), caches[m], 0,
					lens.Add(int64(4*m)), 0, 1, T, ld))
				bad += bitMismatches(got[m*ld:(m+1)*ld], downF32(c, o1, ld))
			}
			record(t, "indexer_scores_wgh_rows of 3 caches vs one launch per row", "mismatched scores", float64(bad), 0)
			o2 := a.poisoned(M * ld)
			chk(k.IndexerScoresWGH2Rows(s, o2, qh, wq, off, bases, lens, 0, M, T, ld))
			record(t, "indexer_scores_wgh2_rows vs indexer_scores_wgh_rows", "mismatched scores", float64(bitMismatches(downF32(c, o2, M*ld), got)), 0)
		}
		record(t, "indexer_scores_wgh launches counted", "launches missing", float64(max(0, 25-int(IndexerWGHLaunches.Load()-before))), 0)
		// Bad arguments are refused before any launch.
		for _, bad := range []struct{ nq, T, ld int }{{0, 100, 100}, {1, 0, 0}, {1, 100, 99}} {
			if err := k.IndexerScoresWGH(s, 1, 1, 1, 1, 0, 1, 0, bad.nq, bad.T, bad.ld); err == nil {
				t.Errorf("IndexerScoresWGH nq=%d T=%d ldOut=%d: no error", bad.nq, bad.T, bad.ld)
			}
		}
		if err := k.IndexerScoresWGHRows(s, 1, 1, 1, 0, 0, 1, 0, 1, 100, 100); err == nil {
			t.Error("IndexerScoresWGHRows without row bases: no error")
		}
	})
}

// TestKernelTimingIdxWGH: the scores + histogram graph-timed, _pf against
// wgh, cold keys (4 copies), the histogram's clearing memset subtracted.
// Reported, never asserted (TILERT_GPU_TIMING=1).
func TestKernelTimingIdxWGH(t *testing.T) {
	needTiming(t)
	onGPU(t, func(c *cuda.Ctx, k *Set, a *allocs, r *rand.Rand) {
		needWG(t, c, k)
		s := c.Stream()
		add := timingTable(t, c, a, r, 256<<20, "device-to-device copy 256 MiB (read+write)", "reference of this table")
		img := randIndexerCache(r, 64)
		qh, wq := timingIndexerQuery(k, a, r, s)
		for _, T := range []int{8256, 32768, 131072} {
			nPages := cdiv(T, 64)
			const copies = 4
			caches := coldIndexerCaches(c, a, img, nPages, copies)
			kb := float64(nPages*IndexerPageBytes + 4*T)
			// 2 rows: one slot's MTP step, between the engine's
			// wgh2 rule's measured points (idxWGHPair).
			for _, M := range []int{1, 2, 4} {
				ls := make([]int32, M)
				for i := range ls {
					ls[i] = int32(T - 64 - 37*i)
				}
				lens := a.up(ls)
				out := a.raw(int64(4 * M * T))
				scratch := a.up(make([]byte, TopKRadixScratchBytes(M, T)))
				hist := TopKRadixHist(scratch)
				usz := graphUsRot(c, s, 8, 15, func(int) { chk(c.MemsetD32(hist, 0, int64(M*topkRadixBins), s)) })
				for _, kn := range []struct {
					name string
					f    func(cache cuda.DevPtr) error
				}{
					{"indexer_scores_mma_pf", func(cache cuda.DevPtr) error {
						return k.IndexerScoresMMA(s, out, qh, wq, cache, 0, lens, hist, M, T, T)
					}},
					{"indexer_scores_wgh", func(cache cuda.DevPtr) error {
						return k.IndexerScoresWGH(s, out, qh, wq, cache, 0, lens, hist, M, T, T)
					}},
					{"indexer_scores_wgh2", func(cache cuda.DevPtr) error {
						return k.IndexerScoresWGH2(s, out, qh, wq, cache, 0, lens, hist, M, T, T)
					}},
				} {
					us := graphUsRot(c, s, 8, 15, func(i int) {
						chk(kn.f(caches[i%copies]))
						chk(c.MemsetD32(hist, 0, int64(M*topkRadixBins), s))
					})
					add(fmtName("graph: %s+hist rows=%d T=%d", kn.name, M, T), float64(M)*kb, us-usz, "cold keys (4 copies); memset subtracted")
				}
			}
		}
	})
}
