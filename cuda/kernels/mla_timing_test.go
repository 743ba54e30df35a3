package kernels

// Timings of the MLA decode and absorb kernels at DeepSeek-V3.2 / GLM-5
// decode shapes and their TP-8 shards, old kernels beside new, against a
// device-to-device copy measured in the same run (reported, never
// asserted; TILERT_GPU_TIMING=1 as for TestKernelTiming).

import (
	"math/rand/v2"
	"testing"

	"github.com/tilert-go/tilert/cuda"
)

func TestKernelTimingMLA(t *testing.T) {
	needTiming(t)
	onGPU(t, func(c *cuda.Ctx, k *Set, a *allocs, r *rand.Rand) {
		s := c.Stream()
		add := timingTable(t, c, a, r, 256<<20, "device-to-device copy 256 MiB (read+write)", "reference of this table")
		{
			const H, nidx, T = 128, 2048, 65536
			cache := devMLACache(c, a, r, T)
			for _, nq := range []int{1, 4} {
				qn, qp, ip, lens, out := devMLAQueries(a, r, nq, H, nidx, T)
				// Room for twice the planned splits (the timed alternatives).
				ws := a.raw(MLAWorkspaceBytes(nq, H, 2*mlaHeadsSplits))
				// Each row reads its 2048 entries once; the queries in, the output out.
				for _, hs := range []int{H, 16, 8} {
					if nq > 1 && hs != H {
						continue
					}
					nb := float64(nq * (nidx*MLATokenBytes + 4*hs*(512+64+512)))
					ns := k.MLAHeadsSplits(nq, hs, nidx)
					us := medianUs(c, s, 10, 21, func() {
						chk(k.MLADecodeHeads(s, out, 0, qn, qp, cache, 0, ip, lens, ws, nq, hs, nidx, nidx, ns, 0.1))
					})
					add(fmtName("mla_decode_heads H=%d topk=2048 nq=%d split=%d", hs, nq, ns), nb, us, "")
					ns = k.MLATCSplits(nq, hs, nidx)
					splits := []int{ns}
					if nq == 1 && hs == H {
						splits = append(splits, ns/2, min(2*ns, mlaHeadsSplits))
					}
					for _, sp := range splits {
						us = medianUs(c, s, 10, 21, func() {
							chk(k.MLADecodeTC(s, out, 0, qn, qp, cache, 0, ip, lens, ws, nq, hs, nidx, nidx, sp, 0.1))
						})
						add(fmtName("mla_decode_tc H=%d topk=2048 nq=%d split=%d", hs, nq, sp), nb, us, "")
					}
				}
			}
		}
		for _, sh := range []struct {
			name           string
			M, H, nope, vd int
		}{{"DeepSeek-V3.2", 1, 128, 128, 128}, {"DeepSeek-V3.2", 4, 128, 128, 128}, {"DeepSeek-V3.2 TP-8", 1, 16, 128, 128},
			{"GLM-5", 1, 64, 192, 256}, {"GLM-5 TP-8", 1, 8, 192, 256}} {
			// Absorbed-MLA products: one block per head vs spread over the SMs.
			const R, P = 512, 64
			M, H, nope, vd := sh.M, sh.H, sh.nope, sh.vd
			rows := H * max(nope, vd)
			w, sc := a.raw(int64(rows*R)), a.raw(int64(4*rows*R/128))
			fillRandom(c, r, w, int64(rows*R), "fp8")
			fillRandom(c, r, sc, int64(4*rows*R/128), "f32")
			hs := nope + P
			q, qpe := a.up(randF32(r, M*H*hs, 1)), a.raw(int64(4*M*H*P))
			x, out, vo := a.up(randF32(r, M*H*R, 1)), a.raw(int64(4*M*H*R)), a.raw(int64(4*M*H*vd))
			qb := float64(H*nope*R + 4*H*nope*R/128 + 4*M*H*(hs+R))
			vb := float64(H*vd*R + 4*H*vd*R/128 + 4*M*H*(R+vd))
			us := medianUs(c, s, 20, 21, func() {
				chk(k.EngAbsorbQ(s, out, q, w, sc, true, M, H, nope, R, H*hs, hs))
				chk(k.EngCopy2D(s, qpe, q.Add(int64(4*nope)), M*H, P, P, hs))
			})
			add(fmtName("eng_absorb_q + copy2d %s M=%d H=%d", sh.name, M, H), qb, us, "one block per head")
			us = medianUs(c, s, 20, 21, func() { chk(k.AbsorbQFP8(s, out, qpe, q, w, sc, M, H, nope, R, H*hs, hs, P, QRope{})) })
			add(fmtName("absorb_q_fp8 %s M=%d H=%d", sh.name, M, H), qb, us, "RoPE copy included")
			us = medianUs(c, s, 20, 21, func() { chk(k.EngAbsorbV(s, vo, x, w, sc, true, M, H, vd, R, H*vd)) })
			add(fmtName("eng_absorb_v %s M=%d H=%d", sh.name, M, H), vb, us, "one block per head")
			us = medianUs(c, s, 20, 21, func() { chk(k.AbsorbVFP8(s, vo, x, w, sc, M, H, vd, R, H*vd)) })
			add(fmtName("absorb_v_fp8 %s M=%d H=%d", sh.name, M, H), vb, us, "")
		}
	})
}
