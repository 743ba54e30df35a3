package kernels

// Graph-timed indexer top-k and sparse MLA decode at DeepSeek-V3.2 decode
// shapes: each timed call is captured into a CUDA graph (inner calls a
// graph, replays timed with events), so the figures are device time with a
// graph's launch gaps, as in the engine's step, not the host's launch rate
// of medianUs's back-to-back launches. Inputs rotate over several copies
// larger than the L2 together, as a step's layers do. Reported, never
// asserted (TILERT_GPU_TIMING=1).

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/tilert-go/tilert/cuda"
)

// graphUsRot captures inner calls of f(i) (i = 0..inner-1) into one graph and
// returns the median over reps replays of the time per call.
func graphUsRot(c *cuda.Ctx, s cuda.Stream, inner, reps int, f func(i int)) float64 {
	for i := range inner {
		f(i) // warm: module functions, shared-memory limits, scratch state
	}
	chk(c.SyncStream(s))
	chk(c.BeginCapture(s))
	for i := range inner {
		f(i)
	}
	g, err := c.EndCapture(s)
	chk(err)
	defer func() { chk(c.DestroyGraph(g)) }()
	return medianUs(c, s, 1, reps, func() { chk(c.LaunchGraph(g, s)) }) / float64(inner)
}

func TestKernelTimingIdxMLA(t *testing.T) {
	needTiming(t)
	onGPU(t, func(c *cuda.Ctx, k *Set, a *allocs, r *rand.Rand) {
		s := c.Stream()
		add := timingTable(t, c, a, r, 256<<20, "device-to-device copy 256 MiB (read+write)", "reference of this table")
		timeIdxTopK(t, c, k, a, r, s, add)
		timeMLATC(c, k, a, r, s, add)
	})
}

// timingIndexerQuery is IndexerQPrep's query and head weights for 8 rows of
// 64 heads from random inputs (the timing tests' rows).
func timingIndexerQuery(k *Set, a *allocs, r *rand.Rand, s cuda.Stream) (qh, wq cuda.DevPtr) {
	const H = 64
	q, w := a.up(randF32(r, 8*H*128, 1)), a.up(randF32(r, 8*H, 1))
	pos := a.up([]int32{100, 200, 300, 400, 500, 600, 700, 800})
	cosT, sinT := a.up(randF32(r, 1024*32, 1)), a.up(randF32(r, 1024*32, 1))
	qh, wq = a.raw(8*IndexerQRowBytes), a.raw(4*8*IndexerQHeads)
	chk(k.IndexerQPrep(s, qh, wq, q, w, pos, cosT, sinT, 8, H, 64, false, 0.011))
	return qh, wq
}

// coldIndexerCaches makes copies caches of nPages indexer pages, each
// filled from img (64 pages) repeated: the timing tests rotate over them so
// that the keys come cold from memory.
func coldIndexerCaches(c *cuda.Ctx, a *allocs, img []byte, nPages, copies int) []cuda.DevPtr {
	caches := make([]cuda.DevPtr, copies)
	for i := range caches {
		caches[i] = a.raw(int64(nPages * IndexerPageBytes))
		for p := 0; p < nPages; p += 64 {
			chk(c.Upload(caches[i].Add(int64(p*IndexerPageBytes)), img[:min(64, nPages-p)*IndexerPageBytes]))
		}
	}
	return caches
}

// timeIdxTopK: the tensor-core scores (+ histogram) and the radix top-k
// after them, the engine's pair, with each final stage; the top-k alone on
// score distributions of different widths.
func timeIdxTopK(t *testing.T, c *cuda.Ctx, k *Set, a *allocs, r *rand.Rand, s cuda.Stream, add func(string, float64, float64, string)) {
	if !k.IndexerMMASupported() {
		t.Log("indexer mma unsupported: skipped")
		return
	}
	const K = 2048
	img := randIndexerCache(r, 64)
	qh, wq := timingIndexerQuery(k, a, r, s)
	finals := []struct {
		name string
		f    TopKRadixFinal
	}{{"one block", TopKRadixOne}, {"list", TopKRadixList}, {"list w", TopKRadixListW}, {"bitmaps", TopKRadixBitmaps}}
	for _, T := range []int{8192, 131072} {
		nPages := T / 64
		const copies = 4 // 4 x 17 MB at 131072: more than the L2
		caches := coldIndexerCaches(c, a, img, nPages, copies)
		kb := float64(nPages*IndexerPageBytes + 4*T)
		for _, M := range []int{1, 4} {
			ls := make([]int32, M)
			for i := range ls {
				ls[i] = int32(T - 37*i)
			}
			lens := a.up(ls)
			out := a.raw(int64(4 * M * T))
			idx := a.raw(int64(4 * M * K))
			scratch := a.up(make([]byte, TopKRadixScratchBytes(M, T)))
			us := graphUsRot(c, s, 8, 15, func(i int) {
				chk(k.IndexerScoresMMA(s, out, qh, wq, caches[i%copies], 0, lens, TopKRadixHist(scratch), M, T, T))
				// The histogram accumulates over the calls: clear it (timed apart below).
				chk(c.MemsetD32(TopKRadixHist(scratch), 0, int64(M*topkRadixBins), s))
			})
			usz := graphUsRot(c, s, 8, 15, func(int) {
				chk(c.MemsetD32(TopKRadixHist(scratch), 0, int64(M*topkRadixBins), s))
			})
			add(fmtName("graph: indexer_scores_mma+hist rows=%d T=%d", M, T), float64(M)*kb, us-usz, "cold keys (4 copies); memset subtracted")
			for _, fn := range finals {
				us := graphUsRot(c, s, 8, 15, func(i int) {
					chk(k.IndexerScoresMMA(s, out, qh, wq, caches[i%copies], 0, lens, TopKRadixHist(scratch), M, T, T))
					chk(k.TopKRadixAfterHistWith(s, idx, out, lens, scratch, M, T, K, T, K, fn.f))
				})
				add(fmtName("graph: scores+hist, topk after hist (%s) rows=%d T=%d", fn.name, M, T), float64(M)*kb, us, "the engine's pair")
			}
		}
		// The top-k alone (histogram + mark launches) on score rows of
		// different widths: normal, normal offset by 10 sigma (a 12-bit
		// bin holds ~10% of the keys), narrow (one bin).
		if T != 131072 {
			continue
		}
		for _, dist := range []string{"normal", "offset", "narrow"} {
			x := make([]float32, T)
			for i := range x {
				switch dist {
				case "normal":
					x[i] = float32(r.NormFloat64())
				case "offset":
					x[i] = float32(10 + r.NormFloat64())
				default:
					x[i] = 1 + float32(r.IntN(1<<12))/(1<<22)
				}
			}
			sc := a.up(x)
			lens := a.up([]int32{int32(T)})
			idx := a.raw(4 * K)
			scratch := a.up(make([]byte, TopKRadixScratchBytes(1, T)))
			for _, fn := range finals {
				us := graphUsRot(c, s, 8, 15, func(int) {
					chk(k.topkRadix(s, idx, sc, lens, scratch, 1, T, K, T, K, fn.f))
				})
				add(fmtName("graph: topk_radix (%s) %s T=%d", fn.name, dist, T), float64(4*T), us, "2 launches")
			}
		}
	}
}

// timeMLATC: mla_decode_tc (queries by cp.async) against v3 (plain loads)
// over the split counts, the decode and the combine apart.
func timeMLATC(c *cuda.Ctx, k *Set, a *allocs, r *rand.Rand, s cuda.Stream, add func(string, float64, float64, string)) {
	const H, nidx, T = 128, 2048, 131072 // 86 MB of cache: more than the L2
	cache := devMLACache(c, a, r, T)
	const sets = 8
	for _, nq := range []int{1, 4} {
		var qn, qp, lens, out [sets]cuda.DevPtr
		var ip [sets]cuda.DevPtr
		for i := range sets {
			qn[i], qp[i], ip[i], lens[i], out[i] = devMLAQueries(a, r, nq, H, nidx, T)
		}
		ws := a.raw(MLAWorkspaceBytes(nq, H, mlaHeadsSplits))
		nb := float64(nq * (nidx*MLATokenBytes + 4*H*(512+64+512)))
		ns := k.MLATCSplits(nq, H, nidx)
		splits := []int{ns}
		if nq == 1 {
			splits = []int{16, ns, 64}
		}
		// mla_decode_tcp over the splits, and its stage-dropped variants at
		// the planned split (where the time of a tile goes).
		tsplits := []int{ns, 2 * ns}
		if nq == 1 {
			tsplits = []int{8, 16, 24, ns, 48, 64}
		}
		for _, sp := range tsplits {
			us := graphUsRot(c, s, 8, 15, func(i int) {
				chk(k.launchMLATiledParts(mlaTCPKernel, s, out[i], 0, qn[i], qp[i], cache, 0, ip[i], lens[i], ws, nq, H, nidx, nidx, sp, 0.1, true, true))
			})
			add(fmtName("graph: %s nq=%d H=%d split=%d", mlaTCPKernel.name, nq, H, sp), nb, us, "decode + combine")
			us = graphUsRot(c, s, 8, 15, func(i int) {
				chk(k.launchMLATiledParts(mlaTCPKernel, s, out[i], 0, qn[i], qp[i], cache, 0, ip[i], lens[i], ws, nq, H, nidx, nidx, sp, 0.1, true, false))
			})
			add(fmtName("graph: %s nq=%d H=%d split=%d decode only", mlaTCPKernel.name, nq, H, sp), nb, us, "")
			if k.PDLSupported() {
				mlaCombinePDL = true
				us = graphUsRot(c, s, 8, 15, func(i int) {
					chk(k.launchMLATiledParts(mlaTCPKernel, s, out[i], 0, qn[i], qp[i], cache, 0, ip[i], lens[i], ws, nq, H, nidx, nidx, sp, 0.1, true, true))
				})
				mlaCombinePDL = false
				add(fmtName("graph: %s nq=%d H=%d split=%d, combine PDL", mlaTCPKernel.name, nq, H, sp), nb, us, "decode + combine")
			}
		}
		for _, sp := range splits {
			for _, d := range []mlaTiled{mlaTCKernel} {
				us := graphUsRot(c, s, 8, 15, func(i int) {
					chk(k.launchMLATiledParts(d, s, out[i], 0, qn[i], qp[i], cache, 0, ip[i], lens[i], ws, nq, H, nidx, nidx, sp, 0.1, true, true))
				})
				add(fmtName("graph: %s nq=%d H=%d split=%d", d.name, nq, H, sp), nb, us, "decode + combine")
				if d.name != mlaTCKernel.name || sp == 1 {
					continue
				}
				us = graphUsRot(c, s, 8, 15, func(i int) {
					chk(k.launchMLATiledParts(d, s, out[i], 0, qn[i], qp[i], cache, 0, ip[i], lens[i], ws, nq, H, nidx, nidx, sp, 0.1, true, false))
				})
				add(fmtName("graph: %s nq=%d H=%d split=%d decode only", d.name, nq, H, sp), nb, us, "")
				for _, comb := range []string{"mla_combine_wide", "mla_combine_wide_v1"} {
					if sp != ns {
						continue
					}
					dc := d
					dc.combine = comb
					us = graphUsRot(c, s, 8, 15, func(i int) {
						chk(k.launchMLATiledParts(dc, s, out[i], 0, qn[i], qp[i], cache, 0, ip[i], lens[i], ws, nq, H, nidx, nidx, sp, 0.1, false, true))
					})
					add(fmtName("graph: %s nq=%d H=%d split=%d", comb, nq, H, sp), float64(nq*H*sp*4*(MLALatentDim+2)), us, "partials from L2")
				}
			}
		}
	}
	// TP-8 shard: 16 heads.
	qn, qp, ip, lens, out := devMLAQueries(a, r, 1, 16, nidx, T)
	ws := a.raw(MLAWorkspaceBytes(1, 16, mlaHeadsSplits))
	ns := k.MLATCSplits(1, 16, nidx)
	for _, d := range []mlaTiled{mlaTCKernel, mlaTCPKernel} {
		us := graphUsRot(c, s, 8, 15, func(int) {
			chk(k.launchMLATiledParts(d, s, out, 0, qn, qp, cache, 0, ip, lens, ws, 1, 16, nidx, nidx, ns, 0.1, true, true))
		})
		add(fmtName("graph: %s nq=1 H=16 split=%d", d.name, ns), float64(nidx*MLATokenBytes), us, "TP-8 shard")
	}
}

// TestKernelMLATCStaging: mla_decode_tc gives the bits of itself with the
// split partials merged by mla_combine_wide_v1 (whatever mlaCombineFor
// picks) and of mla_decode_tcp (its combine launched plainly and
// programmatically) on fresh random inputs at the serving shape, split and
// unsplit, a partial head group included. (Until session 54 it also checked
// mla_decode_tc_v3, the queries by plain loads, and mla_decode_tcp_sa, the
// scores in two chains, and until session 55 mla_decode_tc32, 32 heads a
// block: timing comparisons, removed.)
func TestKernelMLATCStaging(t *testing.T) {
	onGPU(t, func(c *cuda.Ctx, k *Set, a *allocs, r *rand.Rand) {
		s := c.Stream()
		if c.Info().CCMajor < 8 {
			t.Skip("mla_decode_tc needs sm_80")
		}
		const nidx, T = 2048, 8192
		cache := devMLACache(c, a, r, T)
		for _, cs := range []struct{ nq, H, nsplit int }{{1, 128, 32}, {2, 20, 5}, {1, 128, 1}, {3, 40, 7}, {1, 128, 16}, {4, 128, 8}, {1, 24, 13}} {
			qn, qp, ip, lens, _ := devMLAQueries(a, r, cs.nq, cs.H, nidx, T)
			ws := a.raw(MLAWorkspaceBytes(cs.nq, cs.H, cs.nsplit))
			tcV1 := mlaTCKernel
			tcV1.combine = "mla_combine_wide_v1"
			var got [4][]float32
			for i, d := range []mlaTiled{mlaTCKernel, tcV1, mlaTCPKernel, mlaTCPKernel} {
				out, lse := a.poisoned(cs.nq*cs.H*MLALatentDim), a.poisoned(cs.nq*cs.H)
				mlaCombinePDL = i == 3 // the combine launched programmatically after tcp
				chk(k.launchMLATiled(d, s, out, lse, qn, qp, cache, 0, ip, lens, ws, cs.nq, cs.H, nidx, nidx, cs.nsplit, 0.07))
				mlaCombinePDL = false
				got[i] = append(downF32(c, out, cs.nq*cs.H*MLALatentDim), downF32(c, lse, cs.nq*cs.H)...)
			}
			for i, name := range []string{"tc + mla_combine_wide_v1", "tcp", "tcp + combine PDL"} {
				bad := 0
				for j := range got[0] {
					if math.Float32bits(got[0][j]) != math.Float32bits(got[i+1][j]) || math.IsNaN(float64(got[0][j])) {
						bad++
					}
				}
				record(t, fmtName("mla_decode_tc vs %s nq=%d H=%d split=%d", name, cs.nq, cs.H, cs.nsplit), "mismatched outputs", float64(bad), 0)
			}
		}
	})
}

// TestKernelTopKRadixScratchShapes: one top-k scratch through calls of
// changing row counts and lengths, as the engine's decode, MTP and length
// buckets make them (the layout moves with both, so every call must leave
// all of it zeroed), each final stage, against the CPU reference.
func TestKernelTopKRadixScratchShapes(t *testing.T) {
	onGPU(t, func(c *cuda.Ctx, k *Set, a *allocs, r *rand.Rand) {
		s := c.Stream()
		const K = 2048
		scratch := a.up(make([]byte, TopKRadixScratchBytes(8, 65536)))
		bad := 0
		for i, sh := range []struct{ rows, T int }{{1, 8192}, {2, 8192}, {1, 16384}, {8, 4096}, {3, 65536}, {1, 3000}, {2, 65536}, {1, 8192}} {
			x := make([]float32, sh.rows*sh.T)
			for j := range x {
				x[j] = float32(r.IntN(512)) / 64 // ties
				if i%2 == 1 {
					x[j] = 10 + float32(r.IntN(1<<14))/(1<<13) // a bin of many keys
				}
			}
			ls := make([]int32, sh.rows)
			for j := range ls {
				ls[j] = int32(sh.T - r.IntN(sh.T/2+1))
			}
			xp, lp := a.up(x), a.up(ls)
			final := []TopKRadixFinal{TopKRadixList, TopKRadixBitmaps, TopKRadixGlobal, TopKRadixOne}[i%4]
			for range 2 {
				op := a.poisoned(sh.rows * K)
				chk(k.TopKRadixWith(s, op, xp, lp, scratch, sh.rows, sh.T, K, sh.T, K, final))
				got := downI32(c, op, sh.rows*K)
				for row := range sh.rows {
					want := refTopK(x[row*sh.T:(row+1)*sh.T], int(ls[row]), K)
					for j := range K {
						if got[row*K+j] != want[j] {
							bad++
						}
					}
				}
			}
		}
		record(t, "topk_radix one scratch, rows 1..8 and lengths changing between calls", "mismatched indices", float64(bad), 0)
	})
}
