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
