package kernels

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/tilert-go/tilert/cuda"
)

// idxOneInputs is a query (random fp8 codes and head weights) and a cache
// of pages for IndexerTopKOne's checks: the pages' distribution sets the
// scores' (a block table that maps many blocks to few pages repeats each
// score: ties, and a threshold bin holding many keys).
type idxOneInputs struct {
	qh, wq cuda.DevPtr
}

func newIdxOneInputs(a *allocs, r *rand.Rand, M int) idxOneInputs {
	qb := make([]byte, M*IndexerQRowBytes)
	for i := range qb {
		qb[i] = byte(r.IntN(0x50)) | byte(r.IntN(2))<<7 // |v| < 8: no NaN codes
	}
	wq := make([]float32, M*IndexerQHeads)
	for i := range wq {
		wq[i] = float32(r.NormFloat64() * 0.01)
	}
	return idxOneInputs{a.up(qb), a.up(wq)}
}

// TestKernelIndexerTopKOne: indexer_topk_one against the engine's pair
// (IndexerScoresMMA with the histogram, then TopKRadixAfterHist): scores
// bit for bit, selections element for element, and both against refTopK
// over the scores; one scratch through every case (rows, lengths and
// distributions changing between calls, two calls each), left zeroed;
// then a CUDA graph of one call replayed with other lengths.
func TestKernelIndexerTopKOne(t *testing.T) {
	onGPU(t, func(c *cuda.Ctx, k *Set, a *allocs, r *rand.Rand) {
		s := c.Stream()
		if !k.IndexerMMASupported() {
			t.Skip("indexer mma unsupported")
		}
		const K, maxM, maxT = 2048, 4, 131328
		scratch := a.up(make([]byte, TopKRadixScratchBytes(maxM, maxT)))
		in := newIdxOneInputs(a, r, maxM)
		type tcase struct {
			name  string
			T     int
			lens  []int32
			pages int // distinct pages (0: one per block)
			equal bool
		}
		cases := []tcase{
			{"normal", 131072, []int32{131072}, 0, false},
			{"normal", 131328, []int32{131300}, 0, false},
			{"normal", 65536, []int32{65536}, 0, false},
			{"normal", 32768, []int32{32768}, 0, false},
			{"lens", 131072, []int32{131072, 70000, 2048, 2049}, 0, false},
			{"lens", 131328, []int32{2047, 131328, 40000}, 0, false},
			{"ties (64 pages)", 131072, []int32{131072, 100000}, 64, false},
			{"ties (8 pages)", 65536, []int32{65536}, 8, false},
			{"ties (512 pages)", 131328, []int32{131328, 4097}, 512, false},
			{"all equal", 131072, []int32{131072}, 1, true},
			{"all equal", 65536, []int32{60000, 65536}, 1, true},
			{"normal after", 131072, []int32{131072}, 0, false},
		}
		for ci, cs := range cases {
			M := len(cs.lens)
			nBlocks := cdiv(cs.T, IndexerPageTokens)
			nPages := nBlocks
			if cs.pages > 0 {
				nPages = cs.pages
			}
			cache := randIndexerCache(r, nPages)
			if cs.equal {
				for p := range nPages {
					pg := cache[p*IndexerPageBytes:]
					for tok := 1; tok < IndexerPageTokens; tok++ {
						copy(pg[tok*128:(tok+1)*128], pg[:128])
						copy(pg[64*128+4*tok:64*128+4*tok+4], pg[64*128:64*128+4])
					}
				}
			}
			bt := make([]int32, nBlocks)
			for i := range bt {
				bt[i] = int32(r.IntN(nPages))
				if cs.pages == 0 {
					bt[i] = int32(i)
				}
			}
			cp, btp, lp := a.up(cache), a.up(bt), a.up(cs.lens)
			ld, ldSel := cs.T+5, K+3
			for rep := range 2 {
				outP, selP := a.poisoned(M*ld), a.poisoned(M*ldSel)
				chk(k.IndexerScoresMMA(s, outP, in.qh, in.wq, cp, btp, lp, TopKRadixHist(scratch), M, cs.T, ld))
				chk(k.TopKRadixAfterHistWith(s, selP, outP, lp, scratch, M, cs.T, K, ld, ldSel, TopKRadixOne))
				outO, selO := a.poisoned(M*ld), a.poisoned(M*ldSel)
				chk(k.IndexerTopKOne(s, selO, outO, in.qh, in.wq, cp, btp, lp, scratch, M, cs.T, K, ld, ldSel, rep == 1))
				sp, so := downF32(c, outP, M*ld), downF32(c, outO, M*ld)
				ip, io := downI32(c, selP, M*ldSel), downI32(c, selO, M*ldSel)
				scoreBad, vsPair, vsRef := 0, 0, 0
				for m := range M {
					for tt := range cs.T {
						if math.Float32bits(sp[m*ld+tt]) != math.Float32bits(so[m*ld+tt]) {
							scoreBad++
						}
					}
					want := refTopK(sp[m*ld:m*ld+cs.T], int(cs.lens[m]), K)
					for j := range K {
						if io[m*ldSel+j] != ip[m*ldSel+j] {
							vsPair++
						}
						if io[m*ldSel+j] != want[j] {
							vsRef++
						}
					}
				}
				name := fmtName("indexer_topk_one %s T=%d lens=%v (case %d, %s)", cs.name, cs.T, cs.lens, ci, map[int]string{0: "plain", 1: "cooperative"}[rep])
				record(t, name+" scores vs _pf", "mismatched scores (bits)", float64(scoreBad), 0)
				record(t, name+" vs pair", "mismatched indices", float64(vsPair), 0)
				record(t, name+" vs refTopK", "mismatched indices", float64(vsRef), 0)
			}
		}
		// Every call leaves the scratch zeroed.
		left := downI32(c, scratch, int(TopKRadixScratchBytes(maxM, maxT)/4))
		nz := 0
		for _, v := range left {
			if v != 0 {
				nz++
			}
		}
		record(t, "indexer_topk_one: scratch left zeroed after every case", "nonzero words", float64(nz), 0)

		// Graph replays, the lengths changed between them (as a decode step's
		// graph sees them), plain and cooperative launches captured.
		const T = 131328
		cp := a.up(randIndexerCache(r, cdiv(T, IndexerPageTokens)))
		lp := a.up([]int32{131000, 90000})
		ld := T
		outP, selP := a.poisoned(2*ld), a.poisoned(2*K)
		for _, coop := range []bool{false, true} {
			outO, selO := a.poisoned(2*ld), a.poisoned(2*K)
			chk(c.SyncStream(s))
			chk(c.BeginCapture(s))
			chk(k.IndexerTopKOne(s, selO, outO, in.qh, in.wq, cp, 0, lp, scratch, 2, T, K, ld, K, coop))
			g, err := c.EndCapture(s)
			chk(err)
			for rep, l := range [][]int32{{131000, 90000}, {131001, 2048}, {33000, 131328}, {131328, 131328}} {
				chk(c.Upload(lp, l))
				chk(c.LaunchGraph(g, s))
				chk(k.IndexerScoresMMA(s, outP, in.qh, in.wq, cp, 0, lp, TopKRadixHist(scratch), 2, T, ld))
				chk(k.TopKRadixAfterHistWith(s, selP, outP, lp, scratch, 2, T, K, ld, K, TopKRadixOne))
				sp := downF32(c, outP, 2*ld)
				ip, io := downI32(c, selP, 2*K), downI32(c, selO, 2*K)
				vsPair, vsRef := 0, 0
				for m := range 2 {
					want := refTopK(sp[m*ld:(m+1)*ld], int(l[m]), K)
					for j := range K {
						if io[m*K+j] != ip[m*K+j] {
							vsPair++
						}
						if io[m*K+j] != want[j] {
							vsRef++
						}
					}
				}
				name := fmtName("indexer_topk_one graph replay %d (coop %v) lens=%v", rep+1, coop, l)
				record(t, name+" vs pair", "mismatched indices", float64(vsPair), 0)
				record(t, name+" vs refTopK", "mismatched indices", float64(vsRef), 0)
			}
			chk(c.DestroyGraph(g))
		}
	})
}

// TestKernelTimingIdxOne (TILERT_GPU_TIMING=1): graph-timed, the engine's
// pair (IndexerScoresMMA with the histogram, then TopKRadixAfterHist with
// the engine's final: topk_radix_one32 at 32768, mark_l above) against
// indexer_topk_one launched plainly and cooperatively; keys cold (4 copies
// of the cache, more than the L2 at 131072).
func TestKernelTimingIdxOne(t *testing.T) {
	needTiming(t)
	onGPU(t, func(c *cuda.Ctx, k *Set, a *allocs, r *rand.Rand) {
		s := c.Stream()
		if !k.IndexerMMASupported() {
			t.Skip("indexer mma unsupported")
		}
		add := timingTable(t, c, a, r, 256<<20, "device-to-device copy 256 MiB (read+write)", "reference of this table")
		const K, maxM = 2048, 4
		in := newIdxOneInputs(a, r, maxM)
		img := randIndexerCache(r, 64)
		var coopRuns []func()
		for _, sh := range []struct{ M, T int }{{1, 32768}, {1, 65536}, {1, 131072}, {1, 131328}, {4, 131072}} {
			M, T := sh.M, sh.T
			nPages := cdiv(T, 64)
			const copies = 4
			caches := make([]cuda.DevPtr, copies)
			for i := range caches {
				caches[i] = a.raw(int64(nPages * IndexerPageBytes))
				for p := 0; p < nPages; p += 64 {
					chk(c.Upload(caches[i].Add(int64(p*IndexerPageBytes)), img[:min(64, nPages-p)*IndexerPageBytes]))
				}
			}
			ls := make([]int32, M)
			for i := range ls {
				ls[i] = int32(T - 37*i)
			}
			lens := a.up(ls)
			out, idx := a.raw(int64(4*M*T)), a.raw(int64(4*M*K))
			scratch := a.up(make([]byte, TopKRadixScratchBytes(M, T)))
			kb := float64(M) * float64(nPages*IndexerPageBytes+4*T)
			pair := graphUsRot(c, s, 8, 15, func(i int) {
				chk(k.IndexerScoresMMA(s, out, in.qh, in.wq, caches[i%copies], 0, lens, TopKRadixHist(scratch), M, T, T))
				chk(k.TopKRadixAfterHistWith(s, idx, out, lens, scratch, M, T, K, T, K, TopKRadixOne))
			})
			add(fmtName("graph: pair scores+hist, topk after hist rows=%d T=%d", M, T), kb, pair, "today's engine pair")
			if !k.IndexerTopKOneFits(M, T) {
				t.Logf("indexer_topk_one: rows=%d T=%d does not fit one wave", M, T)
				continue
			}
			one := func(coop bool) {
				us := graphUsRot(c, s, 8, 15, func(i int) {
					chk(k.IndexerTopKOne(s, idx, out, in.qh, in.wq, caches[i%copies], 0, lens, scratch, M, T, K, T, K, coop))
				})
				add(fmtName("graph: indexer_topk_one (%s) rows=%d T=%d", map[bool]string{false: "plain", true: "coop"}[coop], M, T), kb, us,
					fmtName("vs pair %.2f us", pair))
			}
			one(false)
			// Cooperative launches captured into graphs: after every plain
			// row, so a driver refusing the capture costs only these.
			coopRuns = append(coopRuns, func() { one(true) })
		}
		// The slow path: every key equal (one bin holds the row: the list
		// read three times from L2 by every block).
		const T = 131072
		pg := randIndexerCache(r, 1)
		for tok := 1; tok < IndexerPageTokens; tok++ {
			copy(pg[tok*128:(tok+1)*128], pg[:128])
			copy(pg[64*128+4*tok:64*128+4*tok+4], pg[64*128:64*128+4])
		}
		bt := make([]int32, T/64)
		cp, btp, lens := a.up(pg), a.up(bt), a.up([]int32{T})
		out, idx := a.raw(int64(4*T)), a.raw(int64(4*K))
		scratch := a.up(make([]byte, TopKRadixScratchBytes(1, T)))
		pair := graphUsRot(c, s, 4, 9, func(int) {
			chk(k.IndexerScoresMMA(s, out, in.qh, in.wq, cp, btp, lens, TopKRadixHist(scratch), 1, T, T))
			chk(k.TopKRadixAfterHistWith(s, idx, out, lens, scratch, 1, T, K, T, K, TopKRadixOne))
		})
		add("graph: pair, all keys equal rows=1 T=131072", 0, pair, "one bin")
		one := graphUsRot(c, s, 4, 9, func(int) {
			chk(k.IndexerTopKOne(s, idx, out, in.qh, in.wq, cp, btp, lens, scratch, 1, T, K, T, K, false))
		})
		add("graph: indexer_topk_one (plain), all keys equal rows=1 T=131072", 0, one, "one bin: the list path")
		for _, f := range coopRuns {
			f()
		}
	})
}
