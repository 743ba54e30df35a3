package kernels

import (
	"math"
	"math/rand/v2"
	"runtime"
	"sync"
	"testing"

	"github.com/tilert-go/tilert/cuda"
	"github.com/tilert-go/tilert/numeric"
)

// TestKernelIndexerF8: the fp8-instruction scores (IndexerScoresF8 on the
// e4m3 mma.sync; IndexerScoresWG on the e4m3 wgmma where the sm_90a module
// loads) first settle how each instruction accumulates (f8_mma_probe /
// wgi_probe against exact sums, beside the f16 path of IndexerScoresMMA),
// then are checked against
// the float64 score of the query and key codes with a tolerance derived
// from that measurement, against IndexerScoresMMA's scores (bit-identical
// share), their fused histogram against the histogram of their own scores,
// and their top-2048 selection against IndexerScoresMMA's (differing keys)
// at 8192 and 131072 keys.
func TestKernelIndexerF8(t *testing.T) {
	onGPU(t, func(c *cuda.Ctx, k *Set, a *allocs, r *rand.Rand) {
		if !k.IndexerMMASupported() {
			t.Skip("device below sm_89: no e4m3 mma.sync")
		}
		wgErr := k.WGSupported()
		if wgErr != nil {
			t.Logf("indexer_scores_wg not checked: %v", wgErr)
		}
		eps := checkF8Accumulation(t, c, k, a, r, wgErr == nil)
		checkIndexerF8Scores(t, c, k, a, r, eps, wgErr == nil)
		checkIndexerF8Rows(t, c, k, a, r, wgErr == nil)
	})
}

// e4m3Pow2 is the e4m3 code of 2^e (-9 <= e <= 8).
func e4m3Pow2(e int) byte { return numeric.Float32ToFP8E4M3(float32(math.Ldexp(1, e))) }

// The accumulation probes: the e4m3 mma.sync (f8_mma_probe), the f16 path
// of IndexerScoresMMA (f16_mma_probe), wgmma m64n8k32 e4m3 (wgi_probe).
const (
	pathF8 = iota
	pathF16
	pathWG
)

var pathNames = []string{"e4m3 mma.sync m16n8k32", "f16 path (2 x m16n8k16)", "e4m3 wgmma m64n8k32"}

// checkF8Accumulation measures the e4m3 instructions' accumulation and
// returns eps per path: the largest |d - exact| / (|c| + sum |a b|) seen
// over random products (at least 2^-24), the per-instruction error the
// score tolerance is built from.
func checkF8Accumulation(t *testing.T, c *cuda.Ctx, k *Set, a *allocs, r *rand.Rand, wg bool) [3]float64 {
	s := c.Stream()
	paths := []int{pathF8, pathF16}
	if wg {
		paths = append(paths, pathWG)
	}
	// run: n products of A [16][32] x B [8][32] + C [16][8] (wgmma: rows
	// 16-63 zero).
	run := func(A, B []byte, C []float32, n int, path int) []float32 {
		d := a.poisoned(n * 128)
		if path != pathWG {
			chk(k.f8MMAProbe(s, d, a.up(A), a.up(B), a.up(C), n, path == pathF16))
			return downF32(c, d, n*128)
		}
		A64, C64 := make([]byte, n*64*32), make([]float32, n*64*8)
		for it := range n {
			copy(A64[it*64*32:], A[it*16*32:(it+1)*16*32])
			copy(C64[it*64*8:], C[it*16*8:(it+1)*16*8])
		}
		d64 := a.poisoned(n * 64 * 8)
		chk(k.wgiProbe(s, d64, a.up(A64), a.up(B), a.up(C64), n))
		all := downF32(c, d64, n*64*8)
		out := make([]float32, n*128)
		for it := range n {
			copy(out[it*128:], all[it*512:it*512+128])
		}
		return out
	}
	// Crafted: a big product 2^8 and a small one 2^(8-j) in row 0, column
	// 0; where is the small one lost? Variants: the small product at k=1
	// or k=31 (which half of the k32 step), or the big term as C.
	const J = 27
	for _, v := range []struct {
		name    string
		kSmall  int
		bigAsC  bool
		negBig  bool
		addBig2 bool
	}{
		{"big k=0, small k=1", 1, false, false, false},
		{"big k=0, small k=31", 31, false, false, false},
		{"big as C, small k=0", 0, true, false, false},
		{"big k=0 and -big k=16, small k=31 (cancellation)", 31, false, true, false},
	} {
		A, B := make([]byte, J*16*32), make([]byte, J*8*32)
		C := make([]float32, J*128)
		for j := range J {
			e := 8 - j
			ea := (e + 1) >> 1
			if e < 0 {
				ea = -((-e + 1) >> 1)
			}
			eb := e - ea
			if v.bigAsC {
				C[j*128] = 256
			} else {
				A[j*512+0], B[j*256+0] = e4m3Pow2(8), e4m3Pow2(0)
			}
			if v.negBig {
				A[j*512+16], B[j*256+16] = e4m3Pow2(8)|0x80, e4m3Pow2(0)
			}
			A[j*512+v.kSmall], B[j*256+v.kSmall] = e4m3Pow2(ea), e4m3Pow2(eb)
		}
		for _, path := range paths {
			d := run(A, B, C, J, path)
			kept := -1
			var lost []float64
			for j := range J {
				big := 256.0
				if v.negBig {
					big = 0
				}
				want := float32(big + math.Ldexp(1, 8-j))
				if d[j*128] == want && kept == j-1 {
					kept = j
				}
				if d[j*128] != want && len(lost) < 4 {
					lost = append(lost, float64(d[j*128])-big)
				}
			}
			t.Logf("ACCUM %s, %s: 2^8 + 2^(8-j) exact up to j=%d (f32 keeps j<=23); first results past it, minus the big term: %v", pathNames[path], v.name, kept, lost)
		}
	}
	// Random codes: how far from the exact sum, and how often exactly
	// float32's rounding of it.
	const N = 4096
	A, B := randFP8(r, N*16*32), randFP8(r, N*8*32) // every code but NaN
	C := make([]float32, N*128)
	for i := N / 2 * 128; i < len(C); i++ { // half with C (a previous k-step's sum)
		C[i] = float32(r.NormFloat64() * math.Ldexp(1, r.IntN(20)))
	}
	var eps [3]float64
	res := map[int][]float32{}
	for _, path := range paths {
		res[path] = run(A, B, C, N, path)
	}
	for _, path := range paths {
		d := res[path]
		exactF32, same, worst := 0, 0, 0.0
		for it := range N {
			for m := range 16 {
				for n := range 8 {
					sum, abs := float64(C[it*128+m*8+n]), math.Abs(float64(C[it*128+m*8+n]))
					for kk := range 32 {
						p := fp8Table[A[it*512+m*32+kk]] * fp8Table[B[it*256+n*32+kk]]
						sum += p
						abs += math.Abs(p)
					}
					got := d[it*128+m*8+n]
					if got == float32(sum) {
						exactF32++
					}
					if abs > 0 {
						worst = math.Max(worst, math.Abs(float64(got)-sum)/abs)
					}
					if math.Float32bits(got) == math.Float32bits(res[pathF16][it*128+m*8+n]) {
						same++
					}
				}
			}
		}
		t.Logf("ACCUM %s, %d random products: %.4f equal float32(exact sum), %.4f bit-identical to the f16 path; max |d-exact|/(|c|+sum|ab|) = %.3g (2^%.1f)",
			pathNames[path], N*128, float64(exactF32)/float64(N*128), float64(same)/float64(N*128), worst, math.Log2(math.Max(worst, 1e-300)))
		// A wrong fragment layout or descriptor would be far off: the
		// instruction must at least be a float sum of these products.
		record(t, pathNames[path]+" probe, random e4m3 products vs exact", "max|d-exact|/sum|terms|", worst, 1.0/1024)
		eps[path] = math.Max(worst, math.Ldexp(1, -24))
	}
	return eps
}

// idxF8Ref is the float64 score of each key of one row from the query codes
// and weights IndexerQPrep wrote (qh, wq: that row's) and the cache, with
// bound[t] = ks * sum_h |wq_h| * sum_k |q k| (the scale of its rounding).
func idxF8Ref(qh []byte, wq []float32, cache []byte, bt []int32, n int) (ref, bound []float64) {
	const D = IndexerHeadDim
	var q [IndexerQHeads][D]float64
	for h := range IndexerQHeads {
		for d := range D {
			q[h][d] = fp8Table[qh[IndexerQByte(h, d)]]
		}
	}
	ref, bound = make([]float64, n), make([]float64, n)
	workers := runtime.GOMAXPROCS(0)
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var kv [D]float64
			for tt := w; tt < n; tt += workers {
				pgi := tt / IndexerPageTokens
				if bt != nil {
					pgi = int(bt[pgi])
				}
				pg := cache[pgi*IndexerPageBytes:]
				ks := float64(getF32(pg[IndexerPageTokens*D+4*(tt%IndexerPageTokens):]))
				for i := range D {
					kv[i] = fp8Table[pg[(tt%IndexerPageTokens)*D+i]]
				}
				var sc, bd float64
				for h := range IndexerQHeads {
					if wq[h] == 0 {
						continue
					}
					var dot, ab float64
					for i := range D {
						p := q[h][i] * kv[i]
						dot += p
						ab += math.Abs(p)
					}
					sc += float64(wq[h]) * math.Max(0, dot)
					bd += math.Abs(float64(wq[h])) * ab
				}
				ref[tt], bound[tt] = sc*ks, bd*ks
			}
		}()
	}
	wg.Wait()
	return ref, bound
}

// floatKeyGo is common.cuh's float_key.
func floatKeyGo(f float32) uint32 {
	if f != f {
		return 0
	}
	b := math.Float32bits(f)
	if b&0x80000000 != 0 {
		return ^b
	}
	return b | 0x80000000
}

// selDiff counts the keys in one selection and not the other (each side's
// -1 padding ignored).
func selDiff(x, y []int32) int {
	in := map[int32]bool{}
	for _, v := range x {
		if v >= 0 {
			in[v] = true
		}
	}
	d := 0
	for _, v := range y {
		if v < 0 {
			continue
		}
		if in[v] {
			delete(in, v)
		} else {
			d++
		}
	}
	return d + len(in)
}

// idxScoresFn is IndexerScoresMMA's signature (the kernels compared).
type idxScoresFn func(s cuda.Stream, out, qh, wq, cache, blockTable, lens, hist cuda.DevPtr, nq, T, ldOut int) error

func checkIndexerF8Scores(t *testing.T, c *cuda.Ctx, k *Set, a *allocs, r *rand.Rand, eps [3]float64, wg bool) {
	s := c.Stream()
	const K = 2048
	variants := []struct {
		name string
		f    idxScoresFn
		path int
	}{{"indexer_scores_f8", k.IndexerScoresF8, pathF8}}
	if wg {
		variants = append(variants, struct {
			name string
			f    idxScoresFn
			path int
		}{"indexer_scores_wg", k.IndexerScoresWG, pathWG})
	}
	cosT, sinT := a.up(randF32(r, 4096*32, 1)), a.up(randF32(r, 4096*32, 1))
	for _, cs := range []struct {
		name  string
		H, T  int
		lens  []int32
		paged bool
	}{
		{"H=64 T=1000 paged", 64, 1000, []int32{1000, 963, 100}, true},
		{"H=20 T=300", 20, 300, []int32{300, 17}, false},
		{"H=64 T=8192", 64, 8192, []int32{8192}, false},
		{"H=64 T=131072", 64, 131072, []int32{131072}, false},
	} {
		M, T := len(cs.lens), cs.T
		ps := make([]int32, M)
		for i := range ps {
			ps[i] = int32(r.IntN(4096))
		}
		qh, wq := a.raw(int64(M*IndexerQRowBytes)), a.raw(int64(4*M*IndexerQHeads))
		chk(k.IndexerQPrep(s, qh, wq, a.up(randF32(r, M*cs.H*IndexerHeadDim, 1)), a.up(randF32(r, M*cs.H, 1)), a.up(ps),
			cosT, sinT, M, cs.H, 64, false, float32(math.Pow(float64(cs.H), -0.5))*0.088))
		qhH := make([]byte, M*IndexerQRowBytes)
		chk(c.Download(qhH, qh))
		wqH := downF32(c, wq, M*IndexerQHeads)
		nBlocks := cdiv(T, IndexerPageTokens)
		nPages := nBlocks
		var bt []int32
		btp := cuda.DevPtr(0)
		if cs.paged {
			nPages += 3
			bt = make([]int32, nBlocks)
			for i, p := range r.Perm(nPages)[:nBlocks] {
				bt[i] = int32(p)
			}
			btp = a.up(bt)
		}
		cache := randIndexerCache(r, nPages)
		cp, lp := a.up(cache), a.up(cs.lens)
		ld := T + 3
		final := TopKRadixOne // the engine's top-k after the scores
		if T > TopKRadixOneMaxT {
			final = TopKRadixList
		}
		K1 := min(K, T)
		// _pf, the baseline, and the float64 reference of every row.
		scrP := a.up(make([]byte, TopKRadixScratchBytes(M, T)))
		oP, selP := a.poisoned(M*ld), a.poisoned(M*K1)
		chk(k.IndexerScoresMMA(s, oP, qh, wq, cp, btp, lp, TopKRadixHist(scrP), M, T, ld))
		chk(k.TopKRadixAfterHistWith(s, selP, oP, lp, scrP, M, T, K1, ld, K1, final))
		gotP, gsP := downF32(c, oP, M*ld), downI32(c, selP, M*K1)
		refs, bounds, selRefs := make([][]float64, M), make([][]float64, M), make([][]int32, M)
		for m := range M {
			n := min(int(cs.lens[m]), T)
			refs[m], bounds[m] = idxF8Ref(qhH[m*IndexerQRowBytes:(m+1)*IndexerQRowBytes], wqH[m*IndexerQHeads:(m+1)*IndexerQHeads], cache, bt, n)
			// The selection with exact sums (float32 of the float64 scores).
			refF := make([]float32, T)
			for tt := range T {
				refF[tt] = float32(math.Inf(-1))
				if tt < n {
					refF[tt] = float32(refs[m][tt])
				}
			}
			selRefs[m] = refTopK(refF, n, K1)
		}
		for _, vr := range variants {
			// Each head's sum is 4 chained instructions (each within eps of
			// its terms' and incoming sum's magnitudes: 4 eps, and 8x for
			// random products not showing the worst alignment loss), then
			// the float32 epilogue (64 weighted heads, the adds across lanes
			// and warps, the key scale). A wrong fragment, layout or page
			// would be off by O(1) of the same scale.
			rel := 32*eps[vr.path] + math.Ldexp(1, -18)
			scr8 := a.up(make([]byte, TopKRadixScratchBytes(M, T)))
			o8, sel8 := a.poisoned(M*ld), a.poisoned(M*K1)
			chk(vr.f(s, o8, qh, wq, cp, btp, lp, TopKRadixHist(scr8), M, T, ld))
			got8 := downF32(c, o8, M*ld)
			hist := make([]uint32, M*topkRadixBins)
			chk(c.Download(hist, TopKRadixHist(scr8)))
			chk(k.TopKRadixAfterHistWith(s, sel8, o8, lp, scr8, M, T, K1, ld, K1, final))
			gs8 := downI32(c, sel8, M*K1)
			var worstRatio, maxAbs, maxRef, maxDPF, maxPF float64
			same, total, badTail, badHist, badSel := 0, 0, 0, 0, 0
			for m := range M {
				n := min(int(cs.lens[m]), T)
				ref, bound := refs[m], bounds[m]
				row8, rowP := got8[m*ld:m*ld+T], gotP[m*ld:m*ld+T]
				h := make([]uint32, topkRadixBins)
				for tt := range T {
					v := row8[tt]
					if tt >= n {
						if !math.IsInf(float64(v), -1) {
							badTail++
						}
						continue
					}
					h[floatKeyGo(v)>>20]++
					d := math.Abs(float64(v) - ref[tt])
					if math.IsNaN(d) {
						d = math.Inf(1)
					}
					maxAbs = math.Max(maxAbs, d)
					maxRef = math.Max(maxRef, math.Abs(ref[tt]))
					worstRatio = math.Max(worstRatio, d/(rel*bound[tt]+1e-30))
					maxDPF = math.Max(maxDPF, math.Abs(float64(v)-float64(rowP[tt])))
					maxPF = math.Max(maxPF, math.Abs(float64(rowP[tt])))
					if math.Float32bits(v) == math.Float32bits(rowP[tt]) {
						same++
					}
					total++
				}
				for i := range topkRadixBins {
					if h[i] != hist[m*topkRadixBins+i] {
						badHist++
					}
				}
				// The selection of its own scores, element for element.
				want := refTopK(row8, n, K1)
				for j := range K1 {
					if gs8[m*K1+j] != want[j] {
						badSel++
					}
				}
				t.Logf("SELECTION %s %s row %d (n=%d, K=%d): differing keys vs pf %d, vs exact %d (pf vs exact %d)",
					vr.name, cs.name, m, n, K1, selDiff(gs8[m*K1:(m+1)*K1], gsP[m*K1:(m+1)*K1]),
					selDiff(gs8[m*K1:(m+1)*K1], selRefs[m]), selDiff(gsP[m*K1:(m+1)*K1], selRefs[m]))
			}
			t.Logf("SCORES %s %s: max |d-ref| %.3g (max |ref| %.3g, rel %.3g, %.2f of the tolerance %.3g x ks sum|wq| sum|qk|); max |d-pf|/max|pf| %.3g; bit-identical to pf %d of %d (%.4f)",
				vr.name, cs.name, maxAbs, maxRef, maxAbs/math.Max(maxRef, 1e-30), worstRatio, rel, maxDPF/math.Max(maxPF, 1e-30), same, total, float64(same)/float64(max(total, 1)))
			record(t, vr.name+" "+cs.name+" vs float64 codes (tolerance from the measured accumulation)", "max |d|/tol", worstRatio, 1)
			record(t, vr.name+" "+cs.name+" -inf past the row", "unwritten or wrong", float64(badTail), 0)
			record(t, vr.name+" "+cs.name+" histogram vs its own scores'", "mismatched bins", float64(badHist), 0)
			record(t, fmtName("%s %s + topk after hist K=%d vs refTopK of its scores", vr.name, cs.name, K1), "mismatched indices", float64(badSel), 0)
		}
	}
}

// checkIndexerF8Rows: IndexerScoresF8Rows (and IndexerScoresWGRows) over 3
// slots' caches give each row the one-row kernel's bits for that cache
// alone.
func checkIndexerF8Rows(t *testing.T, c *cuda.Ctx, k *Set, a *allocs, r *rand.Rand, wg bool) {
	s := c.Stream()
	const H, M = 64, 3
	const T = 8192 + 64*7
	qh, wq := a.raw(M*IndexerQRowBytes), a.raw(4*M*IndexerQHeads)
	chk(k.IndexerQPrep(s, qh, wq, a.up(randF32(r, M*H*128, 1)), a.up(randF32(r, M*H, 1)), a.up([]int32{100, 200, 300}),
		a.up(randF32(r, 1024*32, 1)), a.up(randF32(r, 1024*32, 1)), M, H, 64, false, 0.011))
	caches := make([]cuda.DevPtr, M)
	for i := range caches {
		caches[i] = a.up(randIndexerCache(r, T/IndexerPageTokens+2))
	}
	ls := []int32{T, T - 100, 3000}
	lens := a.up(ls)
	const off = 2 * IndexerPageBytes
	bases := rowBases(a, caches, off)
	ld := T + 5
	type rowsFn func(s cuda.Stream, out, qh, wq cuda.DevPtr, cacheOff int64, rowBase, lens, hist cuda.DevPtr, nq, T, ldOut int) error
	kinds := []struct {
		name string
		rows rowsFn
		one  idxScoresFn
	}{{"indexer_scores_f8", k.IndexerScoresF8Rows, k.IndexerScoresF8}}
	if wg {
		kinds = append(kinds, struct {
			name string
			rows rowsFn
			one  idxScoresFn
		}{"indexer_scores_wg", k.IndexerScoresWGRows, k.IndexerScoresWG})
	}
	for _, kd := range kinds {
		out := a.poisoned(M * ld)
		scratch := a.up(make([]byte, TopKRadixScratchBytes(M, T)))
		chk(kd.rows(s, out, qh, wq, off, bases, lens, TopKRadixHist(scratch), M, T, ld))
		got := downF32(c, out, M*ld)
		bad := 0
		for m := range M {
			o1 := a.poisoned(ld)
			chk(kd.one(s, o1, qh.Add(int64(m*IndexerQRowBytes)), wq.Add(int64(4*m*IndexerQHeads)), caches[m], 0,
				lens.Add(int64(4*m)), 0, 1, T, ld))
			want := downF32(c, o1, ld)
			for i := range T {
				if math.Float32bits(got[m*ld+i]) != math.Float32bits(want[i]) {
					bad++
				}
			}
		}
		record(t, kd.name+"_rows (3 caches) vs one launch per row", "mismatched scores", float64(bad), 0)
	}
}
