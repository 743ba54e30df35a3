package kernels

import (
	"math"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/tilert-go/tilert/cuda"
)

// TestMLAFewSplits (pure): the plan stays inside the engine's workspace
// (MLAHeadsWorkspaceBytes), ranges are whole 16-token chunks covering
// nidx, and 2048 tokens of one row of 16 heads are one chunk a range.
func TestMLAFewSplits(t *testing.T) {
	if got := MLAFewSplits(1, 16, 2048); got != 128 {
		t.Errorf("MLAFewSplits(1, 16, 2048) = %d, want 128", got)
	}
	for _, nq := range []int{1, 2, 3, 4, 8, 9, 16} {
		for _, H := range []int{1, 8, 16, 20, 32} {
			for _, nidx := range []int{1, 15, 16, 17, 300, 2048, 8192, 100000} {
				ns := MLAFewSplits(nq, H, nidx)
				tps := cdiv(cdiv(nidx, ns), mlaFewChunk) * mlaFewChunk
				if ns < 1 || ns > mlaFewMaxSplits || cdiv(nidx, tps) != ns || (ns-1)*tps >= nidx {
					t.Errorf("nq=%d H=%d nidx=%d: %d splits of %d tokens", nq, H, nidx, ns, tps)
				}
				if ns > 1 && MLAWorkspaceBytes(nq, H, ns) > MLAHeadsWorkspaceBytes(nq, H) {
					t.Errorf("nq=%d H=%d nidx=%d: %d splits need %d bytes > the engine's %d", nq, H, nidx, ns,
						MLAWorkspaceBytes(nq, H, ns), MLAHeadsWorkspaceBytes(nq, H))
				}
			}
		}
	}
}

// mlaRef64 is the float64 MLA decode of one (row, head) over toks (cache
// entries already resolved): out, lse; no valid token: zeros and -Inf.
func mlaRef64(cache []byte, slot func(tk int) int, qn, qp []float32, toks []int, scale float64) ([]float64, float64) {
	o := make([]float64, 512)
	if len(toks) == 0 {
		return o, math.Inf(-1)
	}
	sc := make([]float64, len(toks))
	mx := math.Inf(-1)
	type entry struct{ cv, rv []float64 }
	memo := map[int]entry{}
	ent := func(tk int) ([]float64, []float64) {
		if e, ok := memo[tk]; ok {
			return e.cv, e.rv
		}
		row := cache[slot(tk)*MLATokenBytes:]
		cv := make([]float64, 512)
		for d := range 512 {
			cv[d] = fp8Table[row[d]] * float64(getF32(row[512+4*(d/128):]))
		}
		rv := make([]float64, 64)
		for i := range 64 {
			rv[i] = bf16ToF64(uint16(row[528+2*i]) | uint16(row[529+2*i])<<8)
		}
		memo[tk] = entry{cv, rv}
		return cv, rv
	}
	for j, tk := range toks {
		cv, rv := ent(tk)
		var d float64
		for i := range 512 {
			d += float64(qn[i]) * cv[i]
		}
		for i := range 64 {
			d += float64(qp[i]) * rv[i]
		}
		sc[j] = d * scale
		mx = math.Max(mx, sc[j])
	}
	var l float64
	for j, tk := range toks {
		p := math.Exp(sc[j] - mx)
		l += p
		cv, _ := ent(tk)
		for i := range 512 {
			o[i] += p * cv[i]
		}
	}
	for i := range o {
		o[i] /= l
	}
	return o, mx + math.Log(l)
}

// TestKernelMLAFew: mla_decode_few + mla_combine_few (TILERT_GPU_MLA_FEW's
// kernels) against the float64 reference on fresh random inputs: a paged
// cache (block table), -1 padding, rows shorter than the selection, a row
// with no valid token (out 0, lse -Inf), dense rows, H = 1, 8, 16, 20, 32;
// then at the serving shape (2048 of 8192 tokens, 16 / 8 / 32 heads, 1-4
// rows) against mla_decode_tcf (three parts: float32-exact products),
// repeat runs bit-identical, per-row cache bases against one launch per
// row, and bad arguments refused.
func TestKernelMLAFew(t *testing.T) {
	onGPU(t, func(c *cuda.Ctx, k *Set, a *allocs, r *rand.Rand) {
		s := c.Stream()
		if err := k.FewSupported(); err != nil {
			t.Skipf("few-heads module: %v", err)
		}
		// Small shapes vs float64.
		for _, cs := range []struct {
			nq, H  int
			lens   []int32
			nidx   int
			sparse bool
		}{
			{2, 16, []int32{300, 270}, 256, true},
			{4, 8, []int32{1000, 5, 600, 0}, 700, true},
			{1, 32, []int32{2100}, 2048, true},
			{2, 20, []int32{77, 300}, 300, false},
			{1, 1, []int32{40}, 40, false},
			{4, 16, []int32{2048, 2047, 1, 33}, 2048, false},
		} {
			nq, H, nidx := cs.nq, cs.H, cs.nidx
			maxLen := 0
			for _, l := range cs.lens {
				maxLen = max(maxLen, int(l))
			}
			nBlocks := max(1, cdiv(maxLen, 64))
			nPages := nBlocks + 3
			cache := randMLACache(r, nPages*64)
			bt := randBlockTable(r, nBlocks, nPages)
			slot := func(tk int) int { return int(bt[tk/64])*64 + tk%64 }
			qn, qp := randF32(r, nq*H*MLALatentDim, 1), randF32(r, nq*H*MLARopeDim, 1)
			const scale = 0.3
			ldIdx := nidx + 5
			idx := make([]int32, nq*ldIdx)
			toks := make([][]int, nq)
			for qi := range nq {
				ln := int(cs.lens[qi])
				if !cs.sparse {
					for tk := range min(ln, nidx) {
						toks[qi] = append(toks[qi], tk)
					}
					continue
				}
				perm := r.Perm(max(ln, 1))
				for j := range ldIdx {
					idx[qi*ldIdx+j] = -1
					switch {
					case qi == 1 && j%7 == 3: // -1 padding inside the selection
					case qi == 2 && j%5 == 0 && ln > 0: // out of range (>= len): skipped
						idx[qi*ldIdx+j] = int32(ln + j)
					case j < nidx && j < ln:
						idx[qi*ldIdx+j] = int32(perm[j])
						toks[qi] = append(toks[qi], perm[j])
					}
				}
			}
			ip := cuda.DevPtr(0)
			if cs.sparse {
				ip = a.up(idx)
			}
			if !cs.sparse {
				ldIdx = nidx
			}
			qnP, qpP, lp, btP := a.up(qn), a.up(qp), a.up(cs.lens), a.up(bt)
			cp := a.up(cache)
			ws := a.raw(max(4, MLAHeadsWorkspaceBytes(nq, H)))
			out, lse := a.poisoned(nq*H*MLALatentDim), a.poisoned(nq*H)
			chk(k.MLADecodeFew(s, out, lse, qnP, qpP, cp, btP, 0, ip, lp, ws, nq, H, nidx, ldIdx, scale))
			got, gl := downF32(c, out, nq*H*MLALatentDim), downF32(c, lse, nq*H)
			var worst, worstL, mx float64
			for qi := range nq {
				for h := range H {
					qh := qi*H + h
					o, l := mlaRef64(cache, slot, qn[qh*512:(qh+1)*512], qp[qh*64:(qh+1)*64], toks[qi], scale)
					for i := range 512 {
						mx = math.Max(mx, math.Abs(o[i]))
						d := math.Abs(float64(got[qh*512+i]) - o[i])
						if math.IsNaN(d) {
							d = math.Inf(1)
						}
						worst = math.Max(worst, d)
					}
					switch {
					case math.IsInf(l, -1):
						if !math.IsInf(float64(gl[qh]), -1) {
							worstL = math.Inf(1)
						}
					default:
						d := math.Abs(float64(gl[qh])-l) / math.Max(1, math.Abs(l))
						if math.IsNaN(d) {
							d = math.Inf(1)
						}
						worstL = math.Max(worstL, d)
					}
				}
			}
			mode := "sparse"
			if !cs.sparse {
				mode = "dense"
			}
			name := fmtName("mla_decode_few vs float64 %s nq=%d H=%d nidx=%d lens=%v splits=%d", mode, nq, H, nidx, cs.lens, MLAFewSplits(nq, H, nidx))
			record(t, name, relMetric, worst/math.Max(mx, 1e-30), boundTC)
			record(t, name+" lse", "max|d|/max(1,|lse|)", worstL, boundTC)
		}
		// Serving shapes vs mla_decode_tcf (three parts).
		const nidx, T = 2048, 8192
		cache := devMLACache(c, a, r, T)
		diff := func(got, want []float32) float64 {
			var worst, sc float64
			for j, v := range want {
				sc = math.Max(sc, math.Abs(float64(v)))
				d := math.Abs(float64(got[j]) - float64(v))
				if math.IsNaN(d) {
					d = math.Inf(1)
				}
				worst = math.Max(worst, d)
			}
			return worst / sc
		}
		for _, cs := range []struct{ nq, H int }{{1, 16}, {1, 8}, {1, 32}, {2, 16}, {4, 16}, {3, 24}} {
			nq, H := cs.nq, cs.H
			qn, qp, ip, lens, _ := devMLAQueries(a, r, nq, H, nidx, T)
			ws := a.raw(MLAHeadsWorkspaceBytes(nq, H))
			run := func(f func(out, lse cuda.DevPtr)) []float32 {
				out, lse := a.poisoned(nq*H*MLALatentDim), a.poisoned(nq*H)
				f(out, lse)
				return append(downF32(c, out, nq*H*MLALatentDim), downF32(c, lse, nq*H)...)
			}
			want := run(func(out, lse cuda.DevPtr) {
				chk(k.MLADecodeTCF(s, MLATCF3, out, lse, qn, qp, cache, 0, 0, ip, lens, ws, nq, H, nidx, nidx, k.MLATCSplits(nq, H, nidx), 0.07))
			})
			few := func(out, lse cuda.DevPtr) {
				chk(k.MLADecodeFew(s, out, lse, qn, qp, cache, 0, 0, ip, lens, ws, nq, H, nidx, nidx, 0.07))
			}
			got, again := run(few), run(few)
			record(t, fmtName("mla_decode_few vs tcf nq=%d H=%d splits=%d", nq, H, MLAFewSplits(nq, H, nidx)), "max|d|/max|tcf|", diff(got, want), 1e-5)
			bad := 0
			for j := range got {
				if math.Float32bits(got[j]) != math.Float32bits(again[j]) {
					bad++
				}
			}
			record(t, fmtName("mla_decode_few repeat nq=%d H=%d", nq, H), "mismatched outputs", float64(bad), 0)
		}
		// Per-row cache bases (the engine's slots) vs one launch per row.
		const nq, H = 3, 16
		regions := []cuda.DevPtr{devMLACache(c, a, r, T), cache, devMLACache(c, a, r, T)}
		base := make([]int64, nq)
		for i, p := range regions {
			base[i] = int64(p) - int64(cache)
		}
		bp := a.up(base)
		qn, qp, ip, lens, _ := devMLAQueries(a, r, nq, H, nidx, T)
		ws := a.raw(MLAHeadsWorkspaceBytes(nq, H))
		rowsOut, perOut := a.poisoned(nq*H*MLALatentDim), a.poisoned(nq*H*MLALatentDim)
		chk(k.MLADecodeFew(s, rowsOut, 0, qn, qp, cache, 0, bp, ip, lens, ws, nq, H, nidx, nidx, 0.07))
		at := func(p cuda.DevPtr, i, w int) cuda.DevPtr { return p.Add(int64(4 * i * H * w)) }
		for i := range nq {
			chk(k.MLADecodeFew(s, at(perOut, i, MLALatentDim), 0, at(qn, i, MLALatentDim), at(qp, i, MLARopeDim), regions[i], 0, 0,
				ip.Add(int64(4*i*nidx)), lens.Add(int64(4*i)), ws, 1, H, nidx, nidx, 0.07))
		}
		record(t, "mla_decode_few rows (3 slots) vs one launch per row", "max|d|/max|row|",
			diff(downF32(c, rowsOut, nq*H*MLALatentDim), downF32(c, perOut, nq*H*MLALatentDim)), 1e-5)
		// Bad arguments.
		bad := 0
		for _, h := range []int{0, 33, 128} {
			if k.MLADecodeFew(s, rowsOut, 0, qn, qp, cache, 0, 0, ip, lens, ws, 1, h, nidx, nidx, 0.07) == nil {
				bad++
			}
		}
		if k.MLADecodeFew(s, rowsOut, 0, qn, qp, cache, 0, 0, ip, lens, ws, 1, 16, nidx, nidx-1, 0.07) == nil {
			bad++
		}
		record(t, "mla_decode_few bad arguments refused", "accepted", float64(bad), 0)
	})
}

// TestKernelTopKFast: topk_fast (TILERT_GPU_TOPK_FAST's selection) against
// the CPU reference refTopK element for element and against topk_radix_one_w
// on fresh random rows: normal, ties (64 values), every key in one 12-bit
// bin (narrow), every key equal, rows shorter than K (-1 padding), lengths
// 1..T, several rows; T up to TopKFastMaxT. The scratch is reused across
// calls (the histogram must be left zeroed), and each case runs twice
// (repeat == first).
func TestKernelTopKFast(t *testing.T) {
	onGPU(t, func(c *cuda.Ctx, k *Set, a *allocs, r *rand.Rand) {
		s := c.Stream()
		if err := k.FewSupported(); err != nil {
			t.Skipf("few-heads module: %v", err)
		}
		const K = 2048
		scratch := a.up(make([]byte, TopKRadixScratchBytes(8, TopKFastMaxT)))
		for _, cs := range []struct {
			name string
			rows int
			T    int
			lens []int32
		}{
			{"normal", 1, 8192, nil},
			{"normal", 4, 8192, []int32{8192, 8000, 2049, 2048}},
			{"ties", 8, 8192, []int32{8192, 2047, 2048, 2049, 8191, 100, 5000, 7}},
			{"narrow", 2, 16384, []int32{16384, 9000}},
			{"all equal", 1, 5000, nil},
			{"normal", 3, 32768, []int32{32768, 32767, 20000}},
			{"ties", 2, 32768, nil},
			{"normal", 1, 2049, nil},
			{"normal", 2, 1500, nil},
			{"offset", 1, 20000, nil},
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
				chk(k.TopKFast(s, op, xp, lp, scratch, cs.rows, cs.T, K, cs.T, K))
				chk(k.topkRadix(s, oo, xp, lp, scratch, cs.rows, cs.T, K, cs.T, K, TopKRadixOne))
				got, one := downI32(c, op, cs.rows*K), downI32(c, oo, cs.rows*K)
				mism, vsOne := 0, 0
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
						if got[row*K+j] != one[row*K+j] {
							vsOne++
						}
					}
				}
				name := fmtName("topk_fast %s rows=%d T=%d lens=%v", cs.name, cs.rows, cs.T, cs.lens)
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
				record(t, name+" vs topk_radix_one_w", "mismatched indices", float64(vsOne), 0)
			}
		}
		// After the tensor-core scores' fused histogram (the engine's pair).
		if k.IndexerMMASupported() {
			const T = 8192
			lens := a.up([]int32{T, T - 37, 3000, 1000})
			score := indexerScores4(c, k, a, r, s, T, lens)
			op, oo := a.poisoned(4*K), a.poisoned(4*K)
			sc := score(TopKRadixHist(scratch))
			chk(k.TopKFastAfterHist(s, op, sc, lens, scratch, 4, T, K, T, K))
			score(TopKRadixHist(scratch))
			chk(k.TopKRadixAfterHistWith(s, oo, sc, lens, scratch, 4, T, K, T, K, TopKRadixOne))
			got, one := downI32(c, op, 4*K), downI32(c, oo, 4*K)
			x := downF32(c, sc, 4*T)
			mism, vsOne := 0, 0
			for row, n := range []int{T, T - 37, 3000, 1000} {
				want := refTopK(x[row*T:(row+1)*T], n, K)
				for j := range K {
					if got[row*K+j] != want[j] {
						mism++
					}
					if got[row*K+j] != one[row*K+j] {
						vsOne++
					}
				}
			}
			record(t, "topk_fast after indexer_scores_mma's histogram (4 rows) vs CPU", "mismatched indices", float64(mism), 0)
			record(t, "topk_fast after indexer_scores_mma's histogram (4 rows) vs topk_radix_one_w", "mismatched indices", float64(vsOne), 0)
		}
		bad := 0
		if k.TopKFast(s, a.raw(4*K), a.raw(4*40000), 0, scratch, 1, 40000, K, 40000, K) == nil {
			bad++
		}
		record(t, "topk_fast T > TopKFastMaxT refused", "accepted", float64(bad), 0)
	})
}

// TestKernelTimingFew (TILERT_GPU_TIMING=1): graph-timed beside a
// device-to-device copy. MLA: 2048 selected of 131072 tokens (cache beyond
// the L2), 8 query sets rotating, 1 row of 16 / 8 / 32 heads and 4 rows of
// 16: mla_decode_tcf2 (the default) at its planned split with the combine
// against mla_decode_few + mla_combine_few. Top-k: the engine's pair
// (indexer_scores_mma with the fused histogram, then the selection) with
// topk_radix_one_w and with topk_fast, and the scores alone, at 8192, 16384 and 32768 keys, 1 and
// 4 rows. (topk_fast16 stopped after each stage, topk_fast16_d1..d4, went
// in session 54.)
func TestKernelTimingFew(t *testing.T) {
	needTiming(t)
	onGPU(t, func(c *cuda.Ctx, k *Set, a *allocs, r *rand.Rand) {
		s := c.Stream()
		add := timingTable(t, c, a, r, 256<<20, "device-to-device copy 256 MiB (read+write)", "reference of this table")
		if err := k.FewSupported(); err != nil {
			t.Skipf("few-heads module: %v", err)
		}
		const nidx, T = 2048, 131072
		cache := devMLACache(c, a, r, T)
		const sets = 8
		for _, sh := range []struct{ nq, H int }{{1, 16}, {1, 8}, {1, 32}, {4, 16}} {
			nq, H := sh.nq, sh.H
			var qn, qp, lens, out, ip [sets]cuda.DevPtr
			for i := range sets {
				qn[i], qp[i], ip[i], lens[i], out[i] = devMLAQueries(a, r, nq, H, nidx, T)
			}
			ws := a.raw(MLAHeadsWorkspaceBytes(nq, H))
			nb := float64(nq * (nidx*MLATokenBytes + 4*H*(512+64+512)))
			ns := k.MLATCSplits(nq, H, nidx)
			us := graphUsRot(c, s, 8, 15, func(i int) {
				chk(k.MLADecodeTCF(s, MLATCF2, out[i], 0, qn[i], qp[i], cache, 0, 0, ip[i], lens[i], ws, nq, H, nidx, nidx, ns, 0.1))
			})
			add(fmtName("graph: mla_decode_tcf2 nq=%d H=%d split=%d", nq, H, ns), nb, us, "decode + combine (the default)")
			us = graphUsRot(c, s, 8, 15, func(i int) {
				chk(k.MLADecodeFew(s, out[i], 0, qn[i], qp[i], cache, 0, 0, ip[i], lens[i], ws, nq, H, nidx, nidx, 0.1))
			})
			add(fmtName("graph: mla_decode_few nq=%d H=%d split=%d", nq, H, MLAFewSplits(nq, H, nidx)), nb, us, "decode + combine (TILERT_GPU_MLA_FEW=1)")
		}
		if !k.IndexerMMASupported() {
			t.Log("indexer mma unsupported: top-k timing skipped")
			return
		}
		const H, K = 64, 2048
		img := randIndexerCache(r, 64)
		q, w := a.up(randF32(r, 8*H*128, 1)), a.up(randF32(r, 8*H, 1))
		pos := a.up([]int32{100, 200, 300, 400, 500, 600, 700, 800})
		cosT, sinT := a.up(randF32(r, 1024*32, 1)), a.up(randF32(r, 1024*32, 1))
		qh, wq := a.raw(8*IndexerQRowBytes), a.raw(4*8*IndexerQHeads)
		chk(k.IndexerQPrep(s, qh, wq, q, w, pos, cosT, sinT, 8, H, 64, false, 0.011))
		for _, T := range []int{8192, 16384, 32768} {
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
			for _, M := range []int{1, 4} {
				ls := make([]int32, M)
				for i := range ls {
					ls[i] = int32(T - 37*i)
				}
				lens := a.up(ls)
				sc := a.raw(int64(4 * M * T))
				idx := a.raw(int64(4 * M * K))
				scratch := a.up(make([]byte, TopKRadixScratchBytes(M, T)))
				usS := graphUsRot(c, s, 8, 15, func(i int) {
					chk(k.IndexerScoresMMA(s, sc, qh, wq, caches[i%copies], 0, lens, TopKRadixHist(scratch), M, T, T))
					chk(c.MemsetD32(TopKRadixHist(scratch), 0, int64(M*topkRadixBins), s))
				})
				usZ := graphUsRot(c, s, 8, 15, func(int) {
					chk(c.MemsetD32(TopKRadixHist(scratch), 0, int64(M*topkRadixBins), s))
				})
				add(fmtName("graph: indexer_scores_mma+hist rows=%d T=%d", M, T), float64(M)*kb, usS-usZ, "memset subtracted")
				for _, v := range []string{"topk_radix_one_w", "topk_fast"} {
					us := graphUsRot(c, s, 8, 15, func(i int) {
						chk(k.IndexerScoresMMA(s, sc, qh, wq, caches[i%copies], 0, lens, TopKRadixHist(scratch), M, T, T))
						if strings.HasSuffix(v, "fast") {
							chk(k.TopKFastAfterHist(s, idx, sc, lens, scratch, M, T, K, T, K))
						} else {
							chk(k.TopKRadixAfterHistWith(s, idx, sc, lens, scratch, M, T, K, T, K, TopKRadixOne))
						}
					})
					add(fmtName("graph: scores+hist, %s rows=%d T=%d", v, M, T), float64(M)*kb, us,
						fmtName("the engine's pair; selection ~%.2f us", us-(usS-usZ)))
				}
			}
		}
	})
}
