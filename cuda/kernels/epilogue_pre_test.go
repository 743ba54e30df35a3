package kernels

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/tilert-go/tilert/cuda"
)

// TestKernelEpiloguePre checks attn_epilogue_qsp (EpiloguePre) against
// attn_epilogue_qs on fresh random inputs: every output (the latent row and
// the indexer key written back, both caches, the query codes and the head
// weights) bit for bit, at both models' indexer heads and q_a sums (192
// partials at DeepSeek-V3.2 dims, 256 at GLM-5's, 300 for the loop past
// the unrolled 256), RoPE both ways. The qsp run is launched
// programmatically right behind a launch that writes every input it reads
// after its wait (poisoned until then), so a load of those moved before
// the wait would read poison.
func TestKernelEpiloguePre(t *testing.T) {
	onGPU(t, func(c *cuda.Ctx, k *Set, a *allocs, r *rand.Rand) {
		s := c.Stream()
		defer func(on bool) { EpiloguePre = on }(EpiloguePre)
		defer k.SetPDL(k.PDL())
		n0 := AttnEpilogueQSPLaunches.Load()
		const maxPos, rot, nPages, eps = 4096, 64, 64, 1e-6
		cosT, sinT := ropeTables(maxPos, rot)
		cp, sp := a.up(cosT), a.up(sinT)
		for _, sh := range []struct{ IH, nss, K int }{{64, 192, 1536}, {32, 256, 2048}, {64, 300, 2400}} {
			for _, il := range []bool{false, true} {
				pos := []int32{int32(r.IntN(nPages * 64))}
				pp := a.up(pos)
				// One buffer of every input written by the step before the
				// epilogue: kva | ik | query | q_a's sums | head weights.
				const offIK, offQ = 576, 576 + 128
				offSS := offQ + sh.IH*128
				offW := offSS + sh.nss
				total := offW + sh.IH
				src := make([]float32, total)
				copy(src, randF32(r, 576, 2))
				copy(src[offIK:], randF32(r, 128, 1.5))
				copy(src[offQ:], randF32(r, sh.IH*128, 1))
				for i := range sh.nss {
					src[offSS+i] = float32(math.Abs(float64(r.Float32()))) * float32(sh.K) / float32(sh.nss)
				}
				copy(src[offW:], randF32(r, sh.IH, 1))
				zero := a.up(make([]float32, total))
				srcp := a.up(src)
				kvw, ikw, ikb := a.up(randF32(r, 512, 1)), a.up(randF32(r, 128, 1)), a.up(randF32(r, 128, 0.3))
				mlaInit, idxInit := randBytes(r, nPages*64*MLATokenBytes), randBytes(r, nPages*IndexerPageBytes)
				const wscale = 0.0123
				type outs struct {
					in       []float32
					mla, idx []byte
					qh       []byte
					wq       []float32
				}
				run := func(pre bool) outs {
					EpiloguePre = pre
					k.SetPDL(pre)
					in := a.poisoned(total)
					mlap, idxp := a.up(mlaInit), a.up(idxInit)
					qhp, wqp := a.raw(int64(IndexerQRowBytes)), a.poisoned(IndexerQHeads)
					chk(c.SyncStream(s))
					// The producer: in = src + 0, right before the epilogue.
					chk(k.Add(s, in, srcp, zero, total))
					chk(k.AttnEpilogue(s, AttnEpilogue{KVA: in, LdKV: 576, KVNorm: kvw, KVEps: 1e-6, KVInterleaved: il, MLACache: mlap,
						IK: in.Add(int64(4 * offIK)), LdIK: 128, IKNormW: ikw, IKNormB: ikb, IKEps: 1e-6, IdxInterleaved: il, IdxCache: idxp,
						IQ: in.Add(int64(4 * offQ)), IW: in.Add(int64(4 * offW)), QH: qhp, WQ: wqp, IH: sh.IH, WScale: wscale,
						Pos: pp, Cos: cp, Sin: sp, Rot: rot, Rows: 1,
						QS: QScale{SumSq: in.Add(int64(4 * offSS)), N: sh.nss, K: sh.K, Eps: eps}}))
					return outs{downF32(c, in, total), downBytes(c, mlap, len(mlaInit)), downBytes(c, idxp, len(idxInit)),
						downBytes(c, qhp, IndexerQRowBytes), downF32(c, wqp, IndexerQHeads)}
				}
				want, got := run(false), run(true)
				tag := fmt.Sprintf("attn_epilogue_qsp IH=%d sums=%d il=%v (programmatic: %v)", sh.IH, sh.nss, il, k.PDL())
				record(t, tag+": rows written back vs attn_epilogue_qs", "mismatched values", float64(diffF32Bits(want.in, got.in)), 0)
				record(t, tag+": caches vs attn_epilogue_qs", "mismatched bytes", float64(diffBytes(want.mla, got.mla)+diffBytes(want.idx, got.idx)), 0)
				record(t, tag+": query codes vs attn_epilogue_qs", "mismatched bytes", float64(diffBytes(want.qh, got.qh)), 0)
				record(t, tag+": head weights vs attn_epilogue_qs", "mismatched values", float64(diffF32Bits(want.wq, got.wq)), 0)
				// The query codes moved: the check can fail.
				record(t, tag+": query codes written", "all-zero rows", boolMetric(allZero(got.qh)), 0)
			}
		}
		if AttnEpilogueQSPLaunches.Load() == n0 {
			t.Errorf("attn_epilogue_qsp never launched")
		}
	})
}

func allZero(b []byte) bool {
	for _, v := range b {
		if v != 0 {
			return false
		}
	}
	return true
}

func boolMetric(v bool) float64 {
	if v {
		return 1
	}
	return 0
}

// TestKernelScoresPre checks indexer_scores_wgh2p (ScoresPre) against
// indexer_scores_wgh2 on fresh random keys: the scores bit for bit, the -inf
// tail and the columns past T included, at the engine's 8192 bucket (the
// newest key last of a page, first of one, mid-page), paged pages and a
// row of one key. The pre run is launched programmatically right behind a
// copy that writes the page holding the row's newest key (poisoned until
// then), as the attention epilogue does in the step, so a load of that
// page moved before the wait would score poison.
func TestKernelScoresPre(t *testing.T) {
	onGPU(t, func(c *cuda.Ctx, k *Set, a *allocs, r *rand.Rand) {
		needWG(t, c, k)
		s := c.Stream()
		defer func(on bool) { ScoresPre = on }(ScoresPre)
		defer k.SetPDL(k.PDL())
		n0 := IndexerWGH2PLaunches.Load()
		cosT, sinT := a.up(randF32(r, 4096*32, 1)), a.up(randF32(r, 4096*32, 1))
		for _, cs := range []struct {
			name  string
			T     int
			lens  int32
			paged bool
		}{
			{"T=8256 len 8192", 8256, 8192, false},
			{"T=8256 len 8193", 8256, 8193, false},
			{"T=8256 len 8230", 8256, 8230, false},
			{"T=1000 paged len 700", 1000, 700, true},
			{"T=300 len 1", 300, 1, false},
			{"T=131072 len 131072", 131072, 131072, false},
		} {
			q, w := a.up(randF32(r, 64*IndexerHeadDim, 1)), a.up(randF32(r, 64, 1))
			qh, wq := a.raw(int64(IndexerQRowBytes)), a.raw(int64(4*IndexerQHeads))
			chk(k.IndexerQPrep(s, qh, wq, q, w, a.up([]int32{int32(r.IntN(4096))}), cosT, sinT, 1, 64, 64, false, 0.011))
			cacheH, bt, btp := randIndexerKeys(r, a, cs.T, cs.paged)
			lens := a.up([]int32{cs.lens})
			// The page holding the newest key (position lens - 1).
			blk := int(cs.lens-1) / IndexerPageTokens
			page := blk
			if cs.paged {
				page = int(bt[blk])
			}
			pageH := cacheH[page*IndexerPageBytes : (page+1)*IndexerPageBytes]
			ld := cs.T + 3
			run := func(pre bool) []float32 {
				ScoresPre = pre
				k.SetPDL(pre)
				held := append([]byte(nil), cacheH...)
				if pre {
					for i := range pageH {
						held[page*IndexerPageBytes+i] = 0x7f // poison: e4m3 NaN codes and NaN scales
					}
				}
				cache, src := a.up(held), a.up(pageH)
				out := a.poisoned(ld)
				chk(c.SyncStream(s))
				if pre {
					chk(k.EngCopy2D(s, cache.Add(int64(page*IndexerPageBytes)), src, 1, IndexerPageBytes/4, IndexerPageBytes/4, IndexerPageBytes/4))
				}
				chk(k.IndexerScoresWGH2(s, out, qh, wq, cache, btp, lens, 0, 1, cs.T, ld))
				return downF32(c, out, ld)
			}
			want, got := run(false), run(true)
			record(t, fmt.Sprintf("indexer_scores_wgh2p vs wgh2 %s (programmatic: %v)", cs.name, k.PDL()), "mismatched scores", float64(bitMismatches(got, want)), 0)
		}
		if IndexerWGH2PLaunches.Load() == n0 {
			t.Errorf("indexer_scores_wgh2p never launched")
		}
	})
}
