package kernels

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/tilert-go/tilert/cuda"
)

// The one-row decode step's indexer chain with the query prepared in the
// scores' prologue (issue 10): attn_epilogue_norm (q_a's RMSNorm beside the
// kv and indexer-key epilogue) then indexer_scores_mma_pfq, against the
// chain it replaces, RMSNorm then attn_epilogue (with the query blocks)
// then indexer_scores_mma_pf, on fresh random inputs: every output bit for
// bit (the normed q_a, the latent and key rows, both caches, the scores),
// the radix top-k after each one's histogram, and the scores against the
// float64 reference over the caches the new chain wrote (the current
// token's key among them).
func TestKernelIndexerQPro(t *testing.T) {
	onGPU(t, func(c *cuda.Ctx, k *Set, a *allocs, r *rand.Rand) {
		if !k.IndexerMMASupported() {
			t.Skip("the tensor-core indexer needs sm_89 or later")
		}
		s := c.Stream()
		const maxPos, rot, qkScale, eps = 16384, 64, 0.088, 1e-6
		cosT, sinT := ropeTables(maxPos, rot)
		cp, sp := a.up(cosT), a.up(sinT)
		for _, cs := range []struct {
			name        string
			QL, H, K    int
			pos         []int32 // lens = pos + 1: the scores see the key written at pos
			kvIL, idxIL bool
			ldPad       int
		}{
			{"DeepSeek-V3.2 dims at 8192", 1536, 64, 2048, []int32{8191}, true, false, 0},
			{"GLM-5 dims at 5000", 2048, 32, 2048, []int32{4999}, true, true, 0},
			// tiny presets' q_a: rmsnorm_reg's block (32, 64 threads) is
			// smaller than the key part's 160
			{"q_a 96, 16 heads", 96, 16, 32, []int32{79}, false, false, 0},
			{"q_a 160, 16 heads, 2 rows, ld padded", 160, 16, 32, []int32{300, 77}, true, true, 8},
		} {
			M, QL, H := len(cs.pos), cs.QL, cs.H
			ld := QL + cs.ldPad
			lens := make([]int32, M)
			maxLen := 0
			for i, p := range cs.pos {
				lens[i] = p + 1
				maxLen = max(maxLen, int(p)+1)
			}
			T := cdiv(maxLen, IndexerPageTokens) * IndexerPageTokens
			nPages := T / IndexerPageTokens
			ldOut := T + 3
			pp, lp := a.up(cs.pos), a.up(lens)
			qa := randF32(r, M*ld, 3)
			qaw := a.up(randF32(r, QL, 1))
			kva, ik := randF32(r, M*576, 2), randF32(r, M*128, 1.5)
			kvw, ikw, ikb := a.up(randF32(r, 512, 1)), a.up(randF32(r, 128, 1)), a.up(randF32(r, 128, 0.3))
			iq, iw := randF32(r, M*H*128, 1), randF32(r, M*H, 1)
			iqp, iwp := a.up(iq), a.up(iw)
			wscale := float32(math.Pow(float64(H), -0.5)) * qkScale
			mlaInit := make([]byte, nPages*64*MLATokenBytes)
			for i := range mlaInit {
				mlaInit[i] = byte(r.Uint32())
			}
			idxInit := randIndexerCache(r, nPages)
			base := func(kv, ik, mla, idx cuda.DevPtr) AttnEpilogue {
				return AttnEpilogue{KVA: kv, LdKV: 576, KVNorm: kvw, KVEps: eps, MLACache: mla, KVInterleaved: cs.kvIL,
					IK: ik, LdIK: 128, IKNormW: ikw, IKNormB: ikb, IKEps: eps, IdxCache: idx, IdxInterleaved: cs.idxIL,
					Pos: pp, Cos: cp, Sin: sp, Rot: rot, Rows: M}
			}
			type chain struct {
				qa, kv, ik, mla, idx, out, outH, sel cuda.DevPtr
			}
			alloc := func() chain {
				return chain{qa: a.up(qa), kv: a.up(kva), ik: a.up(ik), mla: a.up(mlaInit), idx: a.up(idxInit),
					out: a.poisoned(M * ldOut), outH: a.poisoned(M * ldOut), sel: a.poisoned(M * cs.K)}
			}
			// Today's chain: RMSNorm, attn_epilogue with the query blocks,
			// the scores (and again with the histogram, then the top-k).
			old := alloc()
			qh, wq := a.raw(int64(M*IndexerQRowBytes)), a.poisoned(M*IndexerQHeads)
			chk(k.RMSNorm(s, old.qa, old.qa, qaw, M, QL, ld, ld, eps))
			ep := base(old.kv, old.ik, old.mla, old.idx)
			ep.IQ, ep.IW, ep.IH, ep.WScale, ep.QH, ep.WQ = iqp, iwp, H, wscale, qh, wq
			chk(k.AttnEpilogue(s, ep))
			chk(k.IndexerScoresMMA(s, old.out, qh, wq, old.idx, 0, lp, 0, M, T, ldOut))
			scratch := a.up(make([]byte, TopKRadixScratchBytes(M, T)))
			chk(k.IndexerScoresMMA(s, old.outH, qh, wq, old.idx, 0, lp, TopKRadixHist(scratch), M, T, ldOut))
			chk(k.TopKRadixAfterHist(s, old.sel, old.outH, lp, scratch, M, T, cs.K, ldOut, cs.K))
			// The new one: attn_epilogue_norm, the scores with the query
			// prologue.
			nw := alloc()
			ep = base(nw.kv, nw.ik, nw.mla, nw.idx)
			ep.Norm = RowNorm{X: nw.qa, W: qaw, Y: nw.qa, D: QL, LdX: ld, LdY: ld, Eps: eps}
			chk(k.AttnEpilogue(s, ep))
			q := IdxQuery{Q: iqp, W: iwp, Pos: pp, Cos: cp, Sin: sp, H: H, Rot: rot, Interleaved: cs.idxIL, WScale: wscale}
			chk(k.IndexerScoresMMAQ(s, nw.out, q, nw.idx, 0, lp, 0, M, T, ldOut))
			chk(k.IndexerScoresMMAQ(s, nw.outH, q, nw.idx, 0, lp, TopKRadixHist(scratch), M, T, ldOut))
			chk(k.TopKRadixAfterHist(s, nw.sel, nw.outH, lp, scratch, M, T, cs.K, ldOut, cs.K))

			tag := fmt.Sprintf("%s (rows=%d T=%d il=%v/%v)", cs.name, M, T, cs.kvIL, cs.idxIL)
			bad := diffF32Bits(downF32(c, old.qa, M*ld), downF32(c, nw.qa, M*ld)) +
				diffF32Bits(downF32(c, old.kv, M*576), downF32(c, nw.kv, M*576)) +
				diffF32Bits(downF32(c, old.ik, M*128), downF32(c, nw.ik, M*128))
			idxAfter := downBytes(c, nw.idx, len(idxInit))
			bad += diffBytes(downBytes(c, old.mla, len(mlaInit)), downBytes(c, nw.mla, len(mlaInit)))
			bad += diffBytes(downBytes(c, old.idx, len(idxInit)), idxAfter)
			record(t, "attn_epilogue_norm vs rmsnorm + attn_epilogue "+tag, "mismatched values", float64(bad), 0)
			if diffBytes(idxInit, idxAfter) == 0 {
				t.Errorf("%s: no indexer key written", tag)
			}
			got := downF32(c, nw.out, M*ldOut)
			bad = diffF32Bits(downF32(c, old.out, M*ldOut), got) + diffF32Bits(downF32(c, old.outH, M*ldOut), downF32(c, nw.outH, M*ldOut))
			record(t, "indexer_scores_mma_pfq vs attn_epilogue's query + indexer_scores_mma_pf "+tag, "mismatched scores", float64(bad), 0)
			selOld, selNew := downI32(c, old.sel, M*cs.K), downI32(c, nw.sel, M*cs.K)
			bad = 0
			for m := range M {
				want := refTopK(got[m*ldOut:m*ldOut+T], int(lens[m]), cs.K)
				for j := range cs.K {
					if selNew[m*cs.K+j] != want[j] || selOld[m*cs.K+j] != selNew[m*cs.K+j] {
						bad++
					}
				}
			}
			record(t, fmtName("topk_radix after pfq's histogram K=%d vs CPU and vs the old chain ", cs.K)+tag, "mismatched indices", float64(bad), 0)
			// Reference: the RoPE kernel (checked on its own) on a copy of
			// the query, the quantisation and the scores on the CPU.
			rp := a.up(iq)
			chk(k.RoPE(s, rp, pp, cp, sp, M*H, H, IndexerHeadDim, 0, rot, cs.idxIL))
			wantQ, _, scales := refIndexerQPrep(downF32(c, rp, M*H*IndexerHeadDim), iw, M, H, wscale)
			ref := refIndexerScoresQ(wantQ, scales, iw, M, H, T, idxAfter, nil, lens, qkScale)
			var gotV []float32
			for m := range M {
				gotV = append(gotV, got[m*ldOut:m*ldOut+T]...)
			}
			record(t, "indexer_scores_mma_pfq vs CPU "+tag, relMetric, relErr(gotV, ref), boundF32)
		}
	})
}

// TestAttnEpilogueCheckNorm: the norm form takes one cache and no query
// part, and norms the _reg kernels take.
func TestAttnEpilogueCheckNorm(t *testing.T) {
	ok := AttnEpilogue{KVA: 1, LdKV: 576, KVNorm: 1, MLACache: 4, IK: 1, LdIK: 128, IdxCache: 8, Pos: 1, Cos: 1, Sin: 1, Rot: 64, Rows: 1,
		Norm: RowNorm{X: 16, W: 32, Y: 16, D: 1536, LdX: 1536, LdY: 1536, Eps: 1e-6}}
	if err := ok.Check(); err != nil {
		t.Fatalf("norm form refused: %v", err)
	}
	for name, bad := range map[string]func(a *AttnEpilogue){
		"query part":        func(a *AttnEpilogue) { a.IQ, a.IW, a.QH, a.WQ, a.IH = 1, 1, 1, 1, 64 },
		"row bases":         func(a *AttnEpilogue) { a.MLACache, a.IdxCache, a.Bases, a.MLARows, a.IdxRows = 0, 0, 8, true, true },
		"no weights":        func(a *AttnEpilogue) { a.Norm.W = 0 },
		"no output":         func(a *AttnEpilogue) { a.Norm.Y = 0 },
		"ld below D":        func(a *AttnEpilogue) { a.Norm.LdX = 1000 },
		"too wide for _reg": func(a *AttnEpilogue) { a.Norm.D, a.Norm.LdX, a.Norm.LdY = 16384, 16384, 16384 },
	} {
		a := ok
		bad(&a)
		if err := a.Check(); err == nil {
			t.Errorf("%s: accepted %+v", name, a)
		}
	}
	for _, tc := range []struct {
		D  int
		ok bool
	}{{96, true}, {160, true}, {1536, true}, {2048, true}, {8192, true}, {8193, false}, {0, false}} {
		if got := AttnEpilogueNormOK(tc.D); got != tc.ok {
			t.Errorf("AttnEpilogueNormOK(%d) = %v, want %v", tc.D, got, tc.ok)
		}
	}
}

// TestKernelIndexerQProTiming times the chain after wq_b both ways at 1 row
// (DeepSeek-V3.2 and GLM-5 dims, 8192 and 131072 keys), in a graph as the
// engine runs them: today's attn_epilogue (with the query blocks) then the
// scores, against the scores with the query prologue alone (the epilogue's
// key part runs before wq_b, beside q_a's norm), and that norm launch
// against rmsnorm_reg alone. The histogram is off (no state between runs).
func TestKernelIndexerQProTiming(t *testing.T) {
	needTiming(t)
	onGPU(t, func(c *cuda.Ctx, k *Set, a *allocs, r *rand.Rand) {
		if !k.IndexerMMASupported() {
			t.Skip("the tensor-core indexer needs sm_89 or later")
		}
		s := c.Stream()
		add := timingTable(t, c, a, r, 256<<20, "idx qpro: device-to-device copy 256 MiB (read+write)", "reference of this table")
		const rot = 64
		cosT, sinT := ropeTables(4096, rot)
		cp, sp := a.up(cosT), a.up(sinT)
		img := randIndexerCache(r, 64)
		for _, dims := range []struct {
			name  string
			QL, H int
		}{{"DeepSeek-V3.2", 1536, 64}, {"GLM-5", 2048, 32}} {
			QL, H := dims.QL, dims.H
			pp := a.up([]int32{1000})
			qa, qaw := a.up(randF32(r, QL, 1)), a.up(randF32(r, QL, 1))
			kv, ik := a.up(randF32(r, 576, 1)), a.up(randF32(r, 128, 1))
			kvw, ikw, ikb := a.up(randF32(r, 512, 1)), a.up(randF32(r, 128, 1)), a.up(randF32(r, 128, 1))
			iq, iw := a.up(randF32(r, H*128, 1)), a.up(randF32(r, H, 1))
			mla := a.raw(int64(64 * 64 * MLATokenBytes))
			qh, wq := a.raw(IndexerQRowBytes), a.raw(4*IndexerQHeads)
			ep := AttnEpilogue{KVA: kv, LdKV: 576, KVNorm: kvw, KVEps: 1e-6, MLACache: mla, KVInterleaved: true,
				IK: ik, LdIK: 128, IKNormW: ikw, IKNormB: ikb, IKEps: 1e-6, Pos: pp, Cos: cp, Sin: sp, Rot: rot, Rows: 1}
			epn := ep
			epn.Norm = RowNorm{X: qa, W: qaw, Y: qa, D: QL, LdX: QL, LdY: QL, Eps: 1e-6}
			ep.IQ, ep.IW, ep.IH, ep.WScale, ep.QH, ep.WQ = iq, iw, H, 0.01, qh, wq
			q := IdxQuery{Q: iq, W: iw, Pos: pp, Cos: cp, Sin: sp, H: H, Rot: rot, WScale: 0.01}
			add(fmtName("%s rmsnorm_reg q_a %d graph", dims.name, QL), float64(8*QL), graphUs(c, s, 20, func() {
				chk(k.RMSNorm(s, qa, qa, qaw, 1, QL, QL, QL, 1e-6))
			}), "today's launch before wq_b")
			add(fmtName("%s attn_epilogue_norm q_a %d graph", dims.name, QL), float64(8*QL), graphUs(c, s, 20, func() {
				chk(k.AttnEpilogue(s, epn))
			}), "the new launch before wq_b")
			for _, T := range []int{8192, 131072} {
				nPages := T / 64
				cache := a.raw(int64(nPages * IndexerPageBytes))
				for p := 0; p < nPages; p += 64 {
					chk(c.Upload(cache.Add(int64(p*IndexerPageBytes)), img))
				}
				ep.IdxCache, epn.IdxCache = cache, cache
				lens := a.up([]int32{int32(T)})
				out := a.raw(int64(4 * T))
				kb := float64(nPages*IndexerPageBytes + 4*T)
				add(fmtName("%s attn_epilogue + indexer_scores_mma_pf T=%d graph", dims.name, T), kb, graphUs(c, s, 10, func() {
					chk(k.AttnEpilogue(s, ep))
					chk(k.IndexerScoresMMA(s, out, qh, wq, cache, 0, lens, 0, 1, T, T))
				}), "today's chain after wq_b")
				add(fmtName("%s indexer_scores_mma_pfq T=%d graph", dims.name, T), kb, graphUs(c, s, 10, func() {
					chk(k.IndexerScoresMMAQ(s, out, q, cache, 0, lens, 0, 1, T, T))
				}), "the new chain after wq_b")
				add(fmtName("%s indexer_scores_mma_pf T=%d graph", dims.name, T), kb, graphUs(c, s, 10, func() {
					chk(k.IndexerScoresMMA(s, out, qh, wq, cache, 0, lens, 0, 1, T, T))
				}), "without the prologue")
			}
		}
	})
}
