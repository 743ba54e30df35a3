package kernels

// Kernel timings at DeepSeek-V3.2 decode shapes, reported (never asserted):
// CUDA events around batches of launches, median over repeats, bytes each
// kernel must move against a device-to-device copy measured in the same run.
// Runs only with TILERT_GPU_TIMING=1 (scripts/gpu-check.sh sets it).

import (
	"fmt"
	"math/rand/v2"
	"os"
	"sort"
	"testing"

	"github.com/tilert-go/tilert/cuda"
)

// fillRandom fills n bytes at p with valid random data of the given element
// kind ("fp8", "bf16", "f32"): a 32 MiB random block uploaded, then copied
// on the device, so big weights fill fast and are never zeros.
var randomBlocks = map[string][]byte{}

func fillRandom(c *cuda.Ctx, r *rand.Rand, p cuda.DevPtr, n int64, kind string) {
	const blk = 32 << 20
	b := randomBlocks[kind]
	switch {
	case b != nil:
	case kind == "fp8":
		b = randFP8(r, blk)
	case kind == "bf16":
		b, _ = cuda.BytesOf(randBF16(r, blk/2, 0.05))
	default:
		b, _ = cuda.BytesOf(randF32(r, blk/4, 1))
	}
	randomBlocks[kind] = b
	first := min(n, blk)
	chk(c.Upload(p, b[:first]))
	for off := first; off < n; off += blk {
		chk(c.CopyDtoD(p.Add(off), p, min(blk, n-off), c.Stream()))
	}
	chk(c.SyncStream(c.Stream()))
}

// devFP8 allocates fp8 weights [N][K] and their block scales on the
// device, filled with random data (timings do not depend on the values).
func devFP8(c *cuda.Ctx, a *allocs, r *rand.Rand, N, K int) (w, sc cuda.DevPtr) {
	nsc := cdiv(N, 128) * cdiv(K, 128)
	w = a.raw(int64(N * K))
	fillRandom(c, r, w, int64(N*K), "fp8")
	sc = a.raw(int64(4 * nsc))
	fillRandom(c, r, sc, int64(4*nsc), "f32")
	return w, sc
}

// devFP8s is n devFP8 weights: experts, or copies of one weight cycled so
// that it is read cold.
func devFP8s(c *cuda.Ctx, a *allocs, r *rand.Rand, n, N, K int) (ws, ss []cuda.DevPtr) {
	ws, ss = make([]cuda.DevPtr, n), make([]cuda.DevPtr, n)
	for i := range n {
		ws[i], ss[i] = devFP8(c, a, r, N, K)
	}
	return ws, ss
}

// devBF16s is n bf16 weights [N][K] of random data on the device.
func devBF16s(c *cuda.Ctx, a *allocs, r *rand.Rand, n, N, K int) []cuda.DevPtr {
	ws := make([]cuda.DevPtr, n)
	for i := range n {
		ws[i] = a.raw(int64(2 * N * K))
		fillRandom(c, r, ws[i], int64(2*N*K), "bf16")
	}
	return ws
}

// coldCopies is how many copies of a weight of that many bytes are cycled
// so that they do not stay in the 50 MB L2 (a decode step reads each weight
// once).
func coldCopies(bytes int64) int { return int(min(64, max(1, (256<<20)/bytes))) }

// devMLACache is an fp8_ds_mla cache of T tokens of random data with sane
// scales and rope for every token (so that softmax stays finite).
func devMLACache(c *cuda.Ctx, a *allocs, r *rand.Rand, T int) cuda.DevPtr {
	cache := a.raw(int64(T * MLATokenBytes))
	fillRandom(c, r, cache, int64(T*MLATokenBytes), "fp8")
	img := randMLACache(r, 64)
	for off := 0; off < T; off += 64 {
		chk(c.Upload(cache.Add(int64(off*MLATokenBytes)), img))
	}
	return cache
}

// devMLAQueries is an MLA decode's inputs for nq query rows of H heads:
// random queries (latent, rope), nidx random distinct token indices below T
// a row, every row's length T, and room for the output.
func devMLAQueries(a *allocs, r *rand.Rand, nq, H, nidx, T int) (qn, qp, ip, lens, out cuda.DevPtr) {
	qn, qp = a.up(randF32(r, nq*H*512, 1)), a.up(randF32(r, nq*H*64, 1))
	idx := make([]int32, nq*nidx)
	for q := range nq {
		for i, v := range r.Perm(T)[:nidx] {
			idx[q*nidx+i] = int32(v)
		}
	}
	ls := make([]int32, nq)
	for i := range ls {
		ls[i] = int32(T)
	}
	return qn, qp, a.up(idx), a.up(ls), a.raw(int64(4 * nq * H * 512))
}

// medianUs times inner back-to-back runs of f between two events, reps
// times, and returns the median time of one run in microseconds.
func medianUs(c *cuda.Ctx, s cuda.Stream, inner, reps int, f func()) float64 {
	e0, err := c.NewEvent()
	chk(err)
	e1, err := c.NewEvent()
	chk(err)
	defer c.DestroyEvent(e0)
	defer c.DestroyEvent(e1)
	for range 3 {
		f()
	}
	chk(c.SyncStream(s))
	ts := make([]float64, reps)
	for i := range reps {
		chk(c.Record(e0, s))
		for range inner {
			f()
		}
		chk(c.Record(e1, s))
		chk(c.EventSync(e1))
		ms, err := c.Elapsed(e0, e1)
		chk(err)
		ts[i] = float64(ms) * 1000 / float64(inner)
	}
	sort.Float64s(ts)
	return ts[reps/2]
}

// needTiming skips t unless TILERT_GPU_TIMING=1: timings are reported,
// never asserted, and run where scripts/gpu-check.sh asks for them.
func needTiming(t *testing.T) {
	t.Helper()
	if os.Getenv("TILERT_GPU_TIMING") != "1" {
		t.Skip("timing runs only with TILERT_GPU_TIMING=1 (scripts/gpu-check.sh)")
	}
}

// timingTable times a device-to-device copy of n bytes of random data,
// reports it as the table's reference row (copyName, copyComment) and
// returns add, which reports a row (bytes moved, median microseconds of one
// run) with its bandwidth also as a fraction of that copy's.
func timingTable(t *testing.T, c *cuda.Ctx, a *allocs, r *rand.Rand, n int64, copyName, copyComment string) (add func(name string, bytes, us float64, comment string)) {
	var copyGBps float64
	add = func(name string, bytes, us float64, comment string) {
		row := timingRow{Name: name, Bytes: bytes, Median: us, GBps: bytes / us / 1e3, Comment: comment}
		if copyGBps > 0 {
			row.OfCopy = row.GBps / copyGBps
		}
		reportMu.Lock()
		timingRows = append(timingRows, row)
		reportMu.Unlock()
		t.Logf("%-60s %10.3g B %9.2f us %7.0f GB/s %4.0f%% of copy %s", name, bytes, us, row.GBps, 100*row.OfCopy, comment)
	}
	s := c.Stream()
	src, dst := a.raw(n), a.raw(n)
	fillRandom(c, r, src, n, "f32")
	us := medianUs(c, s, 5, 11, func() { chk(c.CopyDtoD(dst, src, n, s)) })
	// The same expression as add's GBps, so the reference row's OfCopy is exactly 1.
	copyGBps = float64(2*n) / us / 1e3
	add(copyName, float64(2*n), us, copyComment)
	return add
}

func TestKernelTiming(t *testing.T) {
	needTiming(t)
	onGPU(t, func(c *cuda.Ctx, k *Set, a *allocs, r *rand.Rand) {
		s := c.Stream()
		add := timingTable(t, c, a, r, 1<<30, "device-to-device copy 1 GiB (read+write)", "reference")
		gemvFP8 := func(N, K, M int) {
			w, sc := devFP8(c, a, r, N, K)
			nsc := cdiv(N, 128) * cdiv(K, 128)
			x := a.up(randF32(r, M*K, 1))
			y := a.raw(int64(4 * M * N))
			us := medianUs(c, s, 20, 21, func() { chk(k.GemvFP8(s, y, x, w, sc, 0, N, K, M, K, N)) })
			add(fmtName("gemv_fp8 N=%d K=%d M=%d", N, K, M), float64(N*K+4*nsc+4*M*(K+N)), us, "")
		}
		gemvFP8(18432, 7168, 1) // dense MLP gate/up
		gemvFP8(18432, 7168, 4) // MTP verification rows
		gemvFP8(7168, 2048, 1)  // expert down
		gemvFP8(24576, 1536, 1) // q_b
		gemvFP8(576, 7168, 1)   // kv_a: small N, long K
		{
			const E, slots, N, K = 64, 8, 2048, 7168
			wt, st := devFP8s(c, a, r, E, N, K)
			nsc := cdiv(N, 128) * cdiv(K, 128)
			ids := make([]int32, slots)
			for i, e := range r.Perm(E)[:slots] {
				ids[i] = int32(e)
			}
			wtp, stp, idp := a.up(wt), a.up(st), a.up(ids)
			x := a.up(randF32(r, K, 1))
			y := a.raw(4 * slots * N)
			us := medianUs(c, s, 20, 21, func() { chk(k.GemvFP8Experts(s, y, x, 0, wtp, stp, idp, slots, N, K)) })
			add("gemv_fp8_experts 8 of 64, N=2048 K=7168", float64(slots*(N*K+4*nsc+4*N)+4*K), us, "")
		}
		// gemv_fp8 against gemv_fp8_wide on the decode shapes, weights cold
		// (coldCopies).
		gemvWidePair := func(N, K, M int, what string) {
			nsc := cdiv(N, 128) * cdiv(K, 128)
			nc := coldCopies(int64(N * K))
			ws, ss := devFP8s(c, a, r, nc, N, K)
			x := a.up(randF32(r, M*K, 1))
			y := a.raw(int64(4 * M * N))
			bytes := float64(N*K + 4*nsc + 4*M*(K+N))
			i := 0
			old := medianUs(c, s, 2*nc, 11, func() { chk(k.GemvFP8(s, y, x, ws[i%nc], ss[i%nc], 0, N, K, M, K, N)); i++ })
			add(fmtName("gemv_fp8 N=%d K=%d M=%d cold", N, K, M), bytes, old, what)
			wide := medianUs(c, s, 2*nc, 11, func() { chk(k.GemvFP8Wide(s, y, x, ws[i%nc], ss[i%nc], 0, N, K, M, K, N)); i++ })
			add(fmtName("gemv_fp8_wide N=%d K=%d M=%d cold R=%d", N, K, M, k.gemvWideRows(N, K, 1, 1)), bytes, wide, fmtName("%.2fx gemv_fp8", old/wide))
		}
		gemvWidePair(256, 7168, 1, "TP-8 q_a/indexer-sized")
		gemvWidePair(576, 7168, 1, "kv_a")
		gemvWidePair(1536, 7168, 1, "q_a")
		gemvWidePair(7168, 2048, 1, "expert down / TP-8 dense down")
		gemvWidePair(24576, 1536, 1, "q_b")
		gemvWidePair(7168, 16384, 1, "o_proj")
		gemvWidePair(18432, 7168, 1, "dense gate/up")
		gemvWidePair(18432, 7168, 4, "dense gate/up, 4 rows")
		bf16Pair := func(N, K int, what string) {
			nc := coldCopies(int64(2 * N * K))
			ws := devBF16s(c, a, r, nc, N, K)
			x := a.up(randF32(r, K, 1))
			y := a.raw(int64(4 * N))
			bytes := float64(2*N*K + 4*(K+N))
			i := 0
			old := medianUs(c, s, 2*nc, 11, func() { chk(k.GemvBF16(s, y, x, ws[i%nc], 0, N, K, 1, K, N)); i++ })
			add(fmtName("gemv_bf16 N=%d K=%d cold", N, K), bytes, old, what)
			wide := medianUs(c, s, 2*nc, 11, func() { chk(k.GemvBF16Wide(s, y, x, ws[i%nc], 0, N, K, 1, K, N)); i++ })
			add(fmtName("gemv_bf16_wide N=%d K=%d cold R=%d", N, K, k.gemvWideRows(N, K, 2, 1)), bytes, wide, fmtName("%.2fx gemv_bf16", old/wide))
		}
		bf16Pair(256, 7168, "router gate")
		bf16Pair(64, 7168, "indexer head weights")
		bf16Pair(129280, 7168, "lm_head (engine keeps gemv_bf16)")
		expertsPair := func(E, slots, N, K int) {
			nsc := cdiv(N, 128) * cdiv(K, 128)
			wt, st := devFP8s(c, a, r, E, N, K)
			wtp, stp := a.up(wt), a.up(st)
			// A different random set of experts each launch, as layers differ.
			const sets = 16
			idps := make([]cuda.DevPtr, sets)
			for i := range idps {
				ids := make([]int32, slots)
				for j, e := range r.Perm(E)[:slots] {
					ids[j] = int32(e)
				}
				idps[i] = a.up(ids)
			}
			x := a.up(randF32(r, K, 1))
			y := a.raw(int64(4 * slots * N))
			bytes := float64(slots*(N*K+4*nsc+4*N) + 4*K)
			i := 0
			old := medianUs(c, s, 2*sets, 11, func() { chk(k.GemvFP8Experts(s, y, x, 0, wtp, stp, idps[i%sets], slots, N, K)); i++ })
			add(fmtName("gemv_fp8_experts %d of %d N=%d K=%d", slots, E, N, K), bytes, old, "")
			wide := medianUs(c, s, 2*sets, 11, func() { chk(k.GemvFP8ExpertsWide(s, y, x, 0, wtp, stp, idps[i%sets], slots, N, K)); i++ })
			add(fmtName("gemv_fp8_experts_wide %d of %d N=%d K=%d R=%d", slots, E, N, K, k.gemvWideRows(N, K, 1, slots)), bytes, wide, fmtName("%.2fx gemv_fp8_experts", old/wide))
		}
		expertsPair(64, 8, 2048, 7168) // routed gate/up (64 experts: 0.9 GB, past L2)
		expertsPair(256, 8, 256, 7168) // TP-8 shard of gate/up
		expertsPair(64, 8, 7168, 2048) // routed down
		{
			const N, K = 129280, 7168
			w := a.raw(2 * N * K)
			fillRandom(c, r, w, 2*N*K, "bf16")
			x := a.up(randF32(r, K, 1))
			y := a.raw(4 * N)
			us := medianUs(c, s, 5, 11, func() { chk(k.GemvBF16(s, y, x, w, 0, N, K, 1, K, N)) })
			add("gemv_bf16 lm_head N=129280 K=7168", float64(2*N*K+4*(N+K)), us, "")
		}
		{
			const D = 7168
			x, w, y := a.up(randF32(r, D, 1)), a.up(randF32(r, D, 1)), a.raw(4*D)
			us := medianUs(c, s, 200, 21, func() { chk(k.RMSNorm(s, y, x, w, 1, D, D, D, 1e-6)) })
			add("rmsnorm D=7168", 12*D, us, "launch-bound")
		}
		{
			const T, H = 65536, 64
			nPages := T / 64
			cache := a.raw(int64(nPages * IndexerPageBytes))
			fillRandom(c, r, cache, int64(nPages*IndexerPageBytes), "fp8")
			q, w := a.up(randF32(r, H*128, 1)), a.up(randF32(r, H, 1))
			lens := a.up([]int32{T})
			out := a.raw(4 * T)
			us := medianUs(c, s, 10, 21, func() { chk(k.IndexerScores(s, out, q, w, cache, 0, lens, 1, H, T, T, 0.088)) })
			add("indexer_scores T=65536 H=64", float64(nPages*IndexerPageBytes+4*T), us, "scales random (not ue8m0)")
			us = medianUs(c, s, 10, 21, func() { chk(k.IndexerScoresWide(s, out, q, w, cache, 0, lens, 1, H, T, T, 0.088)) })
			add("indexer_scores_wide T=65536 H=64", float64(nPages*IndexerPageBytes+4*T), us, "scales random (not ue8m0)")
			idx := a.raw(4 * 2048)
			us = medianUs(c, s, 10, 21, func() { chk(k.TopK(s, idx, out, lens, 1, T, 2048, T, 2048)) })
			add("topk T=65536 K=2048", float64(4*T+4*2048), us, "")
			scratch := a.up(make([]byte, TopKWideScratchBytes(1)))
			us = medianUs(c, s, 10, 21, func() { chk(k.TopKWide(s, idx, out, lens, scratch, 1, T, 2048, T, 2048)) })
			add("topk_wide T=65536 K=2048", float64(4*T+4*2048), us, "10 launches")
		}
		if k.IndexerMMASupported() {
			// Tensor-core scores and the radix top-k at decode contexts,
			// on pages of valid keys with ue8m0 scales and normal scores.
			const H = 64
			img := randIndexerCache(r, 64)
			q, w := a.up(randF32(r, H*128, 1)), a.up(randF32(r, H, 1))
			pos := a.up([]int32{100})
			cosT, sinT := a.up(randF32(r, 128*32, 1)), a.up(randF32(r, 128*32, 1))
			qh, wq := a.raw(IndexerQRowBytes), a.raw(4*IndexerQHeads)
			us := medianUs(c, s, 20, 21, func() { chk(k.IndexerQPrep(s, qh, wq, q, w, pos, cosT, sinT, 1, H, 64, false, 0.011)) })
			add("idx_q_prep H=64", float64(4*H*128+4*H+IndexerQRowBytes+4*IndexerQHeads), us, "rope+quant+scale in one")
			for _, T := range []int{8192, 32768, 131072} {
				nPages := T / 64
				cache := a.raw(int64(nPages * IndexerPageBytes))
				for p := 0; p < nPages; p += 64 {
					chk(c.Upload(cache.Add(int64(p*IndexerPageBytes)), img))
				}
				lens := a.up([]int32{int32(T)})
				out := a.raw(int64(4 * T))
				kb := float64(nPages*IndexerPageBytes + 4*T)
				us := medianUs(c, s, 10, 21, func() { chk(k.IndexerScoresMMA(s, out, qh, wq, cache, 0, lens, 0, 1, T, T)) })
				add(fmtName("indexer_scores_mma T=%d H=64", T), kb, us, "tensor cores, next key group prefetched")
				if T == 131072 {
					us = medianUs(c, s, 5, 11, func() { chk(k.IndexerScoresWide(s, out, q, w, cache, 0, lens, 1, H, T, T, 0.088)) })
					add(fmtName("indexer_scores_wide T=%d H=64", T), kb, us, "float kernel, for comparison")
				}
				sc := a.up(randF32(r, T, 1))
				idx := a.raw(4 * 2048)
				scratch := a.up(make([]byte, TopKRadixScratchBytes(1, T)))
				tb := float64(4*T + 4*2048)
				us = medianUs(c, s, 10, 21, func() { chk(k.TopKRadix(s, idx, sc, lens, scratch, 1, T, 2048, T, 2048)) })
				add(fmtName("topk_radix T=%d K=2048", T), tb, us, "2 launches, final stage in shared memory")
				us = medianUs(c, s, 10, 21, func() { chk(k.topkRadix(s, idx, sc, lens, scratch, 1, T, 2048, T, 2048, TopKRadixGlobal)) })
				add(fmtName("topk_radix T=%d K=2048 global final", T), tb, us, "2 launches")
				us = medianUs(c, s, 10, 21, func() {
					chk(k.IndexerScoresMMA(s, out, qh, wq, cache, 0, lens, TopKRadixHist(scratch), 1, T, T))
					chk(k.TopKRadixAfterHist(s, idx, out, lens, scratch, 1, T, 2048, T, 2048))
				})
				add(fmtName("indexer_scores_mma+hist, topk_radix after hist T=%d", T), kb, us, "the engine's scores + top-k, 2 launches")
				us = medianUs(c, s, 10, 21, func() { chk(k.TopKWide(s, idx, sc, lens, scratch, 1, T, 2048, T, 2048)) })
				add(fmtName("topk_wide T=%d K=2048", T), tb, us, "10 launches, for comparison")
				if T == 8192 {
					us = medianUs(c, s, 10, 21, func() { chk(k.TopK(s, idx, sc, lens, 1, T, 2048, T, 2048)) })
					add(fmtName("topk T=%d K=2048", T), tb, us, "one block, for comparison")
				}
				M := 4
				lensM := a.up([]int32{int32(T), int32(T - 100), int32(T / 2), int32(T - 7)})
				outM := a.raw(int64(4 * M * T))
				qhM, wqM := a.raw(int64(M*IndexerQRowBytes)), a.raw(int64(4*M*IndexerQHeads))
				for i := range M {
					chk(c.CopyDtoD(qhM.Add(int64(i*IndexerQRowBytes)), qh, IndexerQRowBytes, s))
					chk(c.CopyDtoD(wqM.Add(int64(4*i*IndexerQHeads)), wq, 4*IndexerQHeads, s))
				}
				us = medianUs(c, s, 5, 11, func() { chk(k.IndexerScoresMMA(s, outM, qhM, wqM, cache, 0, lensM, 0, M, T, T)) })
				add(fmtName("indexer_scores_mma 4 rows T=%d", T), kb, us, "one launch, keys read by each row")
			}
		}
		{
			const H, nidx, T = 128, 2048, 65536
			cache := devMLACache(c, a, r, T)
			idx := make([]int32, nidx)
			for i, v := range r.Perm(T)[:nidx] {
				idx[i] = int32(v)
			}
			qn, qp := a.up(randF32(r, H*512, 1)), a.up(randF32(r, H*64, 1))
			ip, lens := a.up(idx), a.up([]int32{T})
			out := a.raw(4 * H * 512)
			for _, ns := range []int{1, k.MLASplits(1, H, nidx)} {
				ws := cuda.DevPtr(0)
				if ns > 1 {
					ws = a.raw(MLAWorkspaceBytes(1, H, ns))
				}
				us := medianUs(c, s, 10, 21, func() { chk(k.MLADecode(s, out, 0, qn, qp, cache, 0, ip, lens, ws, 1, H, nidx, nidx, ns, 0.1)) })
				add(fmtName("mla_decode H=128 topk=2048 split=%d", ns), float64(nidx*MLATokenBytes+4*H*(512+64+512)), us, "cache bytes counted once")
			}
			// Heads as M: 1 and 4 query rows (4 slots, or 1 slot + 3 MTP drafts).
			for _, nq := range []int{1, 4} {
				qn4, qp4, ip4, lens4, out4 := devMLAQueries(a, r, nq, H, nidx, T)
				ns := k.MLAHeadsSplits(nq, H, nidx)
				ws := a.raw(MLAHeadsWorkspaceBytes(nq, H))
				us := medianUs(c, s, 10, 21, func() {
					chk(k.MLADecodeHeads(s, out4, 0, qn4, qp4, cache, 0, ip4, lens4, ws, nq, H, nidx, nidx, ns, 0.1))
				})
				add(fmtName("mla_decode_heads H=128 topk=2048 nq=%d split=%d", nq, ns), float64(nq*(nidx*MLATokenBytes+4*H*(512+64+512))), us, "cache bytes counted once per row")
			}
		}
		{
			const E = 256
			lg, b := a.up(randF32(r, E, 2)), a.up(randF32(r, E, 0.1))
			ip, wp := a.raw(4*8), a.raw(4*8)
			us := medianUs(c, s, 200, 21, func() { chk(k.MoERoute(s, ip, wp, lg, b, 1, E, 8, 8, 4, true, 2.5)) })
			add("moe_route E=256 groups 8/4", 4*2*E, us, "launch-bound")
		}
		{
			const V = 129280
			x := a.up(randF32(r, V, 2))
			o := a.raw(4)
			us := medianUs(c, s, 50, 21, func() { chk(k.Argmax(s, o, 0, x, 1, V, V)) })
			add("argmax V=129280", 4*V, us, "")
			sc := a.raw(ArgmaxScratchBytes(1))
			chk(c.MemsetD8(sc, 0, ArgmaxScratchBytes(1), s))
			us = medianUs(c, s, 50, 21, func() { chk(k.ArgmaxWide(s, o, 0, x, sc, 1, V, V)) })
			add("argmax_wide V=129280 (the engine's greedy pick)", 4*V, us, "")
			// The sampled pick is on every sampled step's critical path, as the
			// greedy one is: real settings (DeepSeek-V3.2's generation_config:
			// T 0.6, top-p 0.95) against the greedy pick above.
			for _, sp := range samplerSettings {
				us = medianUs(c, s, 50, 21, func() { chk(k.Sample(s, o, x, 1, V, V, sp.p)) })
				add("sample V=129280 "+sp.name, 4*V, us, "")
			}
			// The many-block sampler: TestKernelTimingSample, in graphs too.
		}
		{
			// Launch overhead: 64 tiny launches direct vs one captured graph.
			const D = 7168
			x, w, y := a.up(randF32(r, D, 1)), a.up(randF32(r, D, 1)), a.raw(4*D)
			gs, err := c.NewStream()
			chk(err)
			defer c.DestroyStream(gs)
			chk(c.BeginCapture(gs))
			for range 64 {
				chk(k.RMSNorm(gs, y, x, w, 1, D, D, D, 1e-6))
			}
			g, err := c.EndCapture(gs)
			chk(err)
			defer c.DestroyGraph(g)
			direct := medianUs(c, gs, 1, 21, func() {
				for range 64 {
					chk(k.RMSNorm(gs, y, x, w, 1, D, D, D, 1e-6))
				}
			})
			graph := medianUs(c, gs, 1, 21, func() { chk(c.LaunchGraph(g, gs)) })
			add("64 x rmsnorm, direct launches", 64*12*D, direct, "")
			add("64 x rmsnorm, one CUDA graph", 64*12*D, graph, "")
		}
	})
}

func fmtName(f string, a ...any) string { return fmt.Sprintf(f, a...) }
