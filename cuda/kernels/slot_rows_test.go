package kernels

// Launches over rows of several slots' caches (per-row cache bases): the
// same bits as one launch per slot, on fresh random inputs.

import (
	"encoding/binary"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/tilert-go/tilert/cuda"
)

// rowBases is the int64 table of the row-base launches: row r's region is
// bases[r] + off.
func rowBases(a *allocs, regions []cuda.DevPtr, off int64) cuda.DevPtr {
	b := make([]byte, 8*len(regions))
	for i, p := range regions {
		binary.LittleEndian.PutUint64(b[8*i:], uint64(p)-uint64(off))
	}
	return a.up(b)
}

func TestKernelSlotRows(t *testing.T) {
	onGPU(t, func(c *cuda.Ctx, k *Set, a *allocs, r *rand.Rand) {
		s := c.Stream()
		// MLA: rows of 3 caches (the last row's selection shorter than the
		// launch's nidx, as a slot at a shorter length) against one launch
		// per row at the same split.
		if c.Info().CCMajor >= 8 {
			const T, H, nidx = 4096, 128, 2048
			const M = 3
			caches := []cuda.DevPtr{devMLACache(c, a, r, T), devMLACache(c, a, r, T), devMLACache(c, a, r, T)}
			qn, qp, ip, lens, _ := devMLAQueries(a, r, M, H, nidx, T)
			idx := downI32(c, ip, M*nidx)
			for j := 1500; j < nidx; j++ {
				idx[2*nidx+j] = -1
			}
			ip = a.up(idx)
			const off = 5 * 64 * MLATokenBytes // the layer's offset in each region
			bases := rowBases(a, caches, off)
			for _, nsplit := range []int{1, 8, 32} {
				ws := a.raw(MLAWorkspaceBytes(M, H, nsplit))
				out, lse := a.poisoned(M*H*MLALatentDim), a.poisoned(M*H)
				chk(k.MLADecodeTCPRows(s, out, lse, qn, qp, off, bases, ip, lens, ws, M, H, nidx, nidx, nsplit, 0.07))
				got := append(downF32(c, out, M*H*MLALatentDim), downF32(c, lse, M*H)...)
				bad := 0
				for m := range M {
					o1, l1 := a.poisoned(H*MLALatentDim), a.poisoned(H)
					chk(k.MLADecodeTCP(s, o1, l1, qn.Add(int64(4*m*H*MLALatentDim)), qp.Add(int64(4*m*H*MLARopeDim)), caches[m], 0,
						ip.Add(int64(4*m*nidx)), lens.Add(int64(4*m)), ws, 1, H, nidx, nidx, nsplit, 0.07))
					want := downF32(c, o1, H*MLALatentDim)
					wantL := downF32(c, l1, H)
					for i, v := range want {
						g := got[m*H*MLALatentDim+i]
						if math.Float32bits(g) != math.Float32bits(v) || math.IsNaN(float64(g)) {
							bad++
						}
					}
					for i, v := range wantL {
						if math.Float32bits(got[M*H*MLALatentDim+m*H+i]) != math.Float32bits(v) {
							bad++
						}
					}
				}
				record(t, fmtName("mla_decode_tcp rows of 3 caches vs one launch per row split=%d", nsplit), "mismatched outputs", float64(bad), 0)
			}
		}
		// Indexer scores (+ the radix histogram, then the top-k) over rows of
		// 3 caches against one launch per row.
		if k.IndexerMMASupported() {
			const H, K, M = 64, 2048, 3
			const T = 8192 + 64*7
			q, w := a.up(randF32(r, M*H*128, 1)), a.up(randF32(r, M*H, 1))
			pos := a.up([]int32{100, 200, 300})
			cosT, sinT := a.up(randF32(r, 1024*32, 1)), a.up(randF32(r, 1024*32, 1))
			qh, wq := a.raw(M*IndexerQRowBytes), a.raw(4*M*IndexerQHeads)
			chk(k.IndexerQPrep(s, qh, wq, q, w, pos, cosT, sinT, M, H, 64, false, 0.011))
			nPages := T / IndexerPageTokens
			caches := make([]cuda.DevPtr, M)
			for i := range caches {
				caches[i] = a.up(randIndexerCache(r, nPages+2))
			}
			ls := []int32{T, T - 100, 3000}
			lens := a.up(ls)
			const off = 2 * IndexerPageBytes
			bases := rowBases(a, caches, off)
			ld := T + 5
			out := a.poisoned(M * ld)
			scratch := a.up(make([]byte, TopKRadixScratchBytes(M, T)))
			chk(k.IndexerScoresMMARows(s, out, qh, wq, off, bases, lens, TopKRadixHist(scratch), M, T, ld))
			got := downF32(c, out, M*ld)
			sel := a.poisoned(M * K)
			chk(k.TopKRadixAfterHistWith(s, sel, out, lens, scratch, M, T, K, ld, K, TopKRadixOne))
			gotSel := downI32(c, sel, M*K)
			bad, badSel := 0, 0
			for m := range M {
				o1 := a.poisoned(ld)
				chk(k.IndexerScoresMMA(s, o1, qh.Add(int64(m*IndexerQRowBytes)), wq.Add(int64(4*m*IndexerQHeads)), caches[m], 0,
					lens.Add(int64(4*m)), 0, 1, T, ld))
				want := downF32(c, o1, ld)
				for i := range T {
					if math.Float32bits(got[m*ld+i]) != math.Float32bits(want[i]) {
						bad++
					}
				}
				wantSel := refTopK(want[:T], int(ls[m]), K)
				for j := range K {
					if gotSel[m*K+j] != wantSel[j] {
						badSel++
					}
				}
			}
			record(t, "indexer_scores_mma rows of 3 caches vs one launch per row", "mismatched scores", float64(bad), 0)
			record(t, "topk_radix_one_w after the rows' histogram vs CPU", "mismatched indices", float64(badSel), 0)
		}
	})
}
