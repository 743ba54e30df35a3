package kernels

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/tilert-go/tilert/cuda"
)

// floatKeyRef is common.cuh's float_key (order-preserving, NaN lowest).
func floatKeyRef(f float32) uint32 {
	if f != f {
		return 0
	}
	b := math.Float32bits(f)
	if b&0x80000000 != 0 {
		return ^b
	}
	return b | 0x80000000
}

// TestKernelTopKCluster: topk_cl (TILERT_GPU_IDX_LONG's selection) against
// the CPU reference refTopK element for element and against
// topk_radix_mark_l (TopKRadixOne's path for rows over 32768 keys, the
// engine's before) on fresh random rows: normal, ties (64 values), every
// key in one 12-bit bin (narrow), every key equal, rows shorter than K (-1
// padding), lengths below T, several rows; T from 32768 to TopKClusterMaxT
// (each topk_cl variant). The scratch is reused across calls (the
// histogram must be left zeroed) and each case runs twice.
func TestKernelTopKCluster(t *testing.T) {
	onGPU(t, func(c *cuda.Ctx, k *Set, a *allocs, r *rand.Rand) {
		s := c.Stream()
		if err := k.FewSupported(); err != nil {
			t.Skipf("few-heads module: %v", err)
		}
		const K = 2048
		scratch := a.up(make([]byte, TopKRadixScratchBytes(4, TopKClusterMaxT)))
		for _, cs := range []struct {
			name string
			rows int
			T    int
			lens []int32
		}{
			{"normal", 1, 131072, nil},
			{"normal", 4, 131072, []int32{131072, 131071, 70000, 2049}},
			{"ties", 2, 131072, []int32{131072, 100001}},
			{"narrow", 1, 131072, nil},
			{"all equal", 1, 65536, nil},
			{"normal", 3, 65536, []int32{65536, 40000, 2048}},
			{"normal", 1, 40007, nil},
			{"ties", 2, 40007, []int32{40007, 1000}},
			{"offset", 1, TopKClusterMaxT, nil},
			{"normal", 2, 200000, []int32{200000, 150001}},
			{"normal", 1, 32768, nil},
			{"normal", 1, 32769, nil},
			{"normal", 2, 131328, []int32{131073, 131328}},
			{"ties", 1, 98305, nil},
			{"normal", 1, 163841, nil},
		} {
			x := make([]float32, cs.rows*cs.T)
			for i := range x {
				switch cs.name {
				case "narrow":
					x[i] = 1 + float32(r.IntN(1<<12))/(1<<22)
				case "all equal":
					x[i] = 0.25
				case "ties":
					x[i] = float32(r.IntN(64)) / 8
				case "offset":
					x[i] = 10 + float32(r.NormFloat64())
				default:
					x[i] = float32(r.NormFloat64())
				}
			}
			lp := cuda.DevPtr(0)
			if cs.lens != nil {
				lp = a.up(cs.lens)
			}
			xp := a.up(x)
			var first []int32
			for rep := range 2 {
				op, oo := a.poisoned(cs.rows*K), a.poisoned(cs.rows*K)
				chk(k.TopKCluster(s, op, xp, lp, scratch, cs.rows, cs.T, K, cs.T, K))
				chk(k.topkRadix(s, oo, xp, lp, scratch, cs.rows, cs.T, K, cs.T, K, TopKRadixOne))
				got, old := downI32(c, op, cs.rows*K), downI32(c, oo, cs.rows*K)
				mism, vsOld := 0, 0
				for row := range cs.rows {
					n := cs.T
					if cs.lens != nil {
						n = int(cs.lens[row])
					}
					want := refTopK(x[row*cs.T:(row+1)*cs.T], n, K)
					for j := range K {
						if got[row*K+j] != want[j] {
							mism++
						}
						if got[row*K+j] != old[row*K+j] {
							vsOld++
						}
					}
				}
				name := fmtName("topk_cl %s rows=%d T=%d lens=%v (%s)", cs.name, cs.rows, cs.T, cs.lens, topkClusterKernel(cs.T))
				if rep == 1 {
					name += " (scratch reused)"
					diff := 0
					for j := range got {
						if got[j] != first[j] {
							diff++
						}
					}
					record(t, name+" repeat", "mismatched indices", float64(diff), 0)
				}
				first = got
				record(t, name+" vs CPU", "mismatched indices", float64(mism), 0)
				record(t, name+" vs topk_radix (before)", "mismatched indices", float64(vsOld), 0)
			}
		}
		bad := 0
		if k.TopKClusterAfterHist(s, a.raw(4*K), a.raw(4), 0, scratch, 1, TopKClusterMaxT+1, K, TopKClusterMaxT+1, K) == nil {
			bad++
		}
		if k.TopKClusterAfterHist(s, a.raw(4*K), a.raw(4), 0, scratch, 1, 1000, 40000, 1000, 40000) == nil {
			bad++
		}
		if k.TopKClusterAfterHist(s, a.raw(4*K), a.raw(4), 0, 0, 1, 1000, K, 1000, K) == nil {
			bad++
		}
		record(t, "topk_cl bad arguments refused", "accepted", float64(bad), 0)
	})
}

// TestKernelIndexerDeep: the deep scores kernels (every depth) write the
// same score bits and the same 12-bit histogram as indexer_scores_mma_pf
// (itself checked against the float64 formula in checkIndexerMMA), the
// histogram is the scores' own (CPU count), and the engine's long pair
// (deep scores + topk_cl) selects refTopK's indices of those scores and
// topk_radix_mark_l's: fresh random fp8 caches, 131072 keys (1 and 4 rows,
// lengths below T), 65536 paged, 40007, 8192; the per-slot Rows launch
// against IndexerScoresMMARows.
func TestKernelIndexerDeep(t *testing.T) {
	onGPU(t, func(c *cuda.Ctx, k *Set, a *allocs, r *rand.Rand) {
		s := c.Stream()
		if !k.IndexerMMASupported() {
			t.Skip("indexer mma needs sm_89")
		}
		fewErr := k.FewSupported()
		const H, K, maxT = 64, 2048, 131072
		nPages := maxT/IndexerPageTokens + 16
		cache := a.up(randIndexerCache(r, nPages))
		for _, cs := range []struct {
			T     int
			lens  []int32
			paged bool
		}{
			{131072, []int32{131072}, false},
			{131328, []int32{131073}, false},
			{131072, []int32{131072, 131000, 99999, 40007}, false},
			{65536, []int32{65536, 65535}, true},
			{40007, []int32{40007}, false},
			{8192, []int32{8192, 5000}, false},
		} {
			M := len(cs.lens)
			q, w := a.up(randF32(r, M*H*128, 1)), a.up(randF32(r, M*H, 1))
			pos := make([]int32, M)
			for i := range pos {
				pos[i] = int32(r.IntN(1024))
			}
			cosT, sinT := a.up(randF32(r, 1024*32, 1)), a.up(randF32(r, 1024*32, 1))
			qh, wq := a.raw(int64(M*IndexerQRowBytes)), a.raw(int64(4*M*IndexerQHeads))
			chk(k.IndexerQPrep(s, qh, wq, q, w, a.up(pos), cosT, sinT, M, H, 64, false, 0.011))
			btp := cuda.DevPtr(0)
			if cs.paged {
				nb := cdiv(cs.T, IndexerPageTokens)
				bt := make([]int32, nb)
				for i, p := range r.Perm(nPages)[:nb] {
					bt[i] = int32(p)
				}
				btp = a.up(bt)
			}
			lp := a.up(cs.lens)
			ld := cs.T + 5
			name := fmtName("T=%d lens=%v paged=%v", cs.T, cs.lens, cs.paged)
			scrA := a.up(make([]byte, TopKRadixScratchBytes(M, cs.T)))
			scrB := a.up(make([]byte, TopKRadixScratchBytes(M, cs.T)))
			opA := a.poisoned(M * ld)
			chk(k.IndexerScoresMMA(s, opA, qh, wq, cache, btp, lp, TopKRadixHist(scrA), M, cs.T, ld))
			want := downF32(c, opA, M*ld)
			histA := make([]uint32, M*topkRadixBins)
			chk(c.Download(histA, TopKRadixHist(scrA)))
			// The histogram is the scores' own.
			hbad := 0
			cpuH := make([]uint32, M*topkRadixBins)
			for m := range M {
				for tt := range int(cs.lens[m]) {
					cpuH[m*topkRadixBins+int(floatKeyRef(want[m*ld+tt])>>20)]++
				}
			}
			for i := range cpuH {
				if cpuH[i] != histA[i] {
					hbad++
				}
			}
			record(t, "indexer_scores_mma_pf histogram vs CPU "+name, "mismatched bins", float64(hbad), 0)
			for _, d := range IndexerMMADepths {
				op := a.poisoned(M * ld)
				chk(k.IndexerScoresMMADeep(s, op, qh, wq, cache, btp, lp, TopKRadixHist(scrB), M, cs.T, ld, d))
				got := downF32(c, op, M*ld)
				histB := make([]uint32, M*topkRadixBins)
				chk(c.Download(histB, TopKRadixHist(scrB)))
				diff, hdiff := 0, 0
				for i := range M * ld {
					if i%ld < cs.T && math.Float32bits(got[i]) != math.Float32bits(want[i]) {
						diff++
					}
				}
				for i := range histB {
					if histB[i] != histA[i] {
						hdiff++
					}
				}
				record(t, fmtName("indexer_scores_mma_d%d vs _pf %s", d, name), "mismatched score bits", float64(diff), 0)
				record(t, fmtName("indexer_scores_mma_d%d histogram vs _pf %s", d, name), "mismatched bins", float64(hdiff), 0)
				if d != IndexerMMADeepDepth {
					chk(c.MemsetD32(TopKRadixHist(scrB), 0, int64(M*topkRadixBins), s))
					continue
				}
				// The engine's pairs, old and new, on these scores.
				selA, selB := a.poisoned(M*K), a.poisoned(M*K)
				chk(k.TopKRadixAfterHistWith(s, selA, opA, lp, scrA, M, cs.T, K, ld, K, TopKRadixOne))
				if fewErr == nil {
					chk(k.TopKClusterAfterHist(s, selB, op, lp, scrB, M, cs.T, K, ld, K))
				} else {
					chk(k.TopKRadixAfterHistWith(s, selB, op, lp, scrB, M, cs.T, K, ld, K, TopKRadixOne))
				}
				gA, gB := downI32(c, selA, M*K), downI32(c, selB, M*K)
				mA, mB := 0, 0
				for m := range M {
					ref := refTopK(got[m*ld:m*ld+cs.T], int(cs.lens[m]), K)
					for j := range K {
						if gA[m*K+j] != ref[j] {
							mA++
						}
						if gB[m*K+j] != ref[j] {
							mB++
						}
					}
				}
				record(t, "old pair (pf + topk_radix one/mark_l) vs CPU "+name, "mismatched indices", float64(mA), 0)
				record(t, fmtName("new pair (d%d + topk_cl, few module: %v) vs CPU %s", d, fewErr == nil, name), "mismatched indices", float64(mB), 0)
				// Both left their histograms zeroed.
				for _, sp := range []cuda.DevPtr{scrA, scrB} {
					h := make([]uint32, M*topkRadixBins)
					chk(c.Download(h, TopKRadixHist(sp)))
					nz := 0
					for _, v := range h {
						if v != 0 {
							nz++
						}
					}
					record(t, "histogram left zeroed "+name, "nonzero bins", float64(nz), 0)
				}
			}
			// One launch over several slots' caches.
			if M > 1 {
				bases := make([]int64, M)
				for m := range bases {
					bases[m] = int64(r.IntN(8)) * IndexerPageBytes
				}
				bp := a.up(bases)
				opR, opRD := a.poisoned(M*ld), a.poisoned(M*ld)
				hR, hRD := a.up(make([]uint32, M*topkRadixBins)), a.up(make([]uint32, M*topkRadixBins))
				chk(k.IndexerScoresMMARows(s, opR, qh, wq, int64(cache), bp, lp, hR, M, cs.T, ld))
				chk(k.IndexerScoresMMARowsDeep(s, opRD, qh, wq, int64(cache), bp, lp, hRD, M, cs.T, ld, IndexerMMADeepDepth))
				x, y := downF32(c, opR, M*ld), downF32(c, opRD, M*ld)
				diff := 0
				for i := range x {
					if i%ld < cs.T && math.Float32bits(x[i]) != math.Float32bits(y[i]) {
						diff++
					}
				}
				h1, h2 := make([]uint32, M*topkRadixBins), make([]uint32, M*topkRadixBins)
				chk(c.Download(h1, hR))
				chk(c.Download(h2, hRD))
				for i := range h1 {
					if h1[i] != h2[i] {
						diff++
					}
				}
				record(t, "indexer_scores_mma_rows_d4 vs _rows "+name, "mismatched score bits/bins", float64(diff), 0)
			}
		}
		bad := 0
		if k.IndexerScoresMMADeep(s, a.raw(4*100), a.raw(IndexerQRowBytes), a.raw(256), cache, 0, a.up([]int32{100}), 0, 1, 100, 100, 5) == nil {
			bad++
		}
		if k.IndexerScoresMMADeep(s, a.raw(4*100), a.raw(IndexerQRowBytes), a.raw(256), cache, 0, a.up([]int32{100}), 0, 1, 100, 99, 4) == nil {
			bad++
		}
		if k.IndexerScoresMMARowsDeep(s, a.raw(4*100), a.raw(IndexerQRowBytes), a.raw(256), 0, 0, a.up([]int32{100}), 0, 1, 100, 100, 4) == nil {
			bad++
		}
		record(t, "indexer_scores_mma deep bad arguments refused", "accepted", float64(bad), 0)
	})
}
