package kernels

import (
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/tilert-go/tilert/cuda"
)

// TestNVRTCQANormLateKernels: the kernels of TILERT_GPU_QA_NORM=late
// compile for sm_90 within their siblings' register bounds (no GPU
// needed): gemv_group_r8_m1_qw beside gemv_group_r8_m1 (the layer-input
// group; three blocks an SM at <= 80), and the absorb module's _n twins of
// absorb_q_fast at their launch bounds (4 blocks an SM for 4 rows a
// thread: 64 registers; 2 for 8: 128).
func TestNVRTCQANormLateKernels(t *testing.T) {
	log, version := ptxasLogSM90(t, moduleSource(kernelFS, "cu/gemv_tile_group.cu", gemvTileHeader), "gemv_tile_group.cu")
	checkRegisters(t, log, version, []regLimit{{"gemv_group_r8_m1", 80}, {"gemv_group_r8_m1_qw", 80}})
	alog, aversion := ptxasLogSM90(t, AbsorbKernelSource(), "tilert_kernels_absorb.cu")
	var lim []regLimit
	// Every kernel absorbQFastKernel names (g8_r8 the one 8-row kernel since
	// session 54) and its _n twin.
	seen := map[string]bool{}
	for _, g := range []int{2, 4, 8} {
		for _, nope := range []int{128, 256} {
			name := absorbQFastKernel(g, nope)
			if seen[name] {
				continue
			}
			seen[name] = true
			regs := 64
			if strings.HasSuffix(name, "_r8") {
				regs = 128
			}
			lim = append(lim, regLimit{name, regs}, regLimit{name + "_n", regs})
		}
	}
	checkRegisters(t, alog, aversion, lim)
}

// TestKernelQANormLate checks TILERT_GPU_QA_NORM=late's three kernels on
// fresh random inputs against the default kernels and float64:
//   - gemv_group_r8_m1_qw: segment 0 is gemv_group_r8_m1's output times OutW
//     bit for bit, each SumSq[b] is the sum of its block's rows' squares in
//     row order (float32, bit for bit), the other segments are unchanged;
//   - absorb_q_fast_..._n: the default kernel's outputs (sums and rotated
//     RoPE part) times r = rsqrt(sum(SumSq) / K + eps) (float64's r, within
//     2e-6 relative: rsqrtf and the partials' order);
//   - attn_epilogue_qs: block 0's cache writes bit for bit attn_epilogue's,
//     the query codes and weights those of attn_epilogue on the query times
//     float32(r) (at most 0.2% of the codes one fp8 step apart: r's last
//     bits; weights within 2e-6);
//
// and refuses calls outside its shape (segment 1, one of the pair, two rows).
func TestKernelQANormLate(t *testing.T) {
	onGPU(t, func(c *cuda.Ctx, k *Set, a *allocs, r *rand.Rand) {
		s := c.Stream()
		g0, s0, e0 := GroupQWLaunches.Load(), AbsorbQScaledLaunches.Load(), AttnEpilogueQSLaunches.Load()
		const eps = 1e-6
		// The layer-input group at both models' dims and a ragged one.
		for _, gc := range []struct {
			K    int
			segs []groupSegCase
		}{
			{7168, []groupSegCase{{1536, false}, {576, false}, {128, false}, {64, true}}},
			{6144, []groupSegCase{{2048, false}, {576, false}, {128, false}, {32, true}}},
			{1024, []groupSegCase{{301, false}, {77, true}}},
		} {
			K := gc.K
			x := a.up(randF32(r, K, 1))
			segs := make([]GroupSeg, len(gc.segs))
			for i, sc := range gc.segs {
				sg := GroupSeg{N: sc.N, LdY: sc.N, BF16: sc.bf16}
				if sc.bf16 {
					sg.W = a.up(randBF16(r, sc.N*K, 0.05))
				} else {
					sg.W, sg.S = a.up(randFP8(r, sc.N*K)), a.up(randScales(r, cdiv(sc.N, 128)*cdiv(K, 128), -8))
				}
				segs[i] = sg
			}
			N0 := segs[0].N
			ow := randF32(r, N0, 1)
			nb := k.GroupSumSqBlocks(segs[0], K)
			rows := k.groupSumSqRows(segs[0], K)
			var def, late [][]float32
			for run := range 2 {
				for i := range segs {
					segs[i].Y = a.poisoned(segs[i].N)
					segs[i].OutW, segs[i].SumSq = 0, 0
				}
				var ss cuda.DevPtr
				if run == 1 {
					ss = a.poisoned(nb + 1)
					segs[0].OutW, segs[0].SumSq = a.up(ow), ss
				}
				chk(k.GemvGroup(s, x, K, 1, K, segs, GroupNorm{}))
				var outs [][]float32
				for _, sg := range segs {
					outs = append(outs, downF32(c, sg.Y, sg.N))
				}
				if run == 0 {
					def = outs
					continue
				}
				late = outs
				got := downF32(c, ss, nb+1)
				want := make([]float32, nb)
				for b := range nb {
					var sum float32
					for i := range rows {
						if n := b*rows + i; n < N0 {
							v := def[0][n]
							sum += v * v
						}
					}
					want[b] = sum
				}
				tag := fmt.Sprintf("gemv_group_r8_m1_qw K=%d N=%d (%d blocks of %d rows)", K, N0, nb, rows)
				record(t, tag+": sums of squares vs the rows in order", "differing sums", float64(diffCount(got[:nb], want)), 0)
				record(t, tag+": nothing past the blocks' sums", "written", float64(diffCount(got[nb:], downF32(c, a.poisoned(1), 1))), 0)
			}
			want0 := make([]float32, N0)
			for n := range N0 {
				want0[n] = def[0][n] * ow[n]
			}
			tag := fmt.Sprintf("gemv_group_r8_m1_qw K=%d", K)
			record(t, tag+": segment 0 vs gemv_group_r8_m1 times OutW", "differing outputs", float64(diffCount(late[0], want0)), 0)
			for i := 1; i < len(segs); i++ {
				record(t, fmt.Sprintf("%s: segment %d vs gemv_group_r8_m1", tag, i), "differing outputs", float64(diffCount(late[i], def[i])), 0)
			}
		}
		// Calls outside the kernel's shape are refused.
		{
			K := 1024
			x := a.up(randF32(r, 2*K, 1))
			w, sc := a.up(randFP8(r, 256*K)), a.up(randScales(r, 2*cdiv(K, 128), -8))
			ow, ss := a.up(randF32(r, 256, 1)), a.poisoned(256)
			seg := func() GroupSeg { return GroupSeg{W: w, S: sc, Y: a.poisoned(2 * 256), N: 256, LdY: 256} }
			for _, bad := range []struct {
				name string
				M    int
				segs func() []GroupSeg
			}{
				{"OutW on segment 1", 1, func() []GroupSeg { s1 := seg(); s1.OutW, s1.SumSq = ow, ss; return []GroupSeg{seg(), s1} }},
				{"OutW without SumSq", 1, func() []GroupSeg { s0 := seg(); s0.OutW = ow; return []GroupSeg{s0} }},
				{"two input rows", 2, func() []GroupSeg { s0 := seg(); s0.OutW, s0.SumSq = ow, ss; return []GroupSeg{s0} }},
			} {
				if err := k.GemvGroup(s, x, K, bad.M, K, bad.segs(), GroupNorm{}); err == nil {
					t.Errorf("gemv group with %s: no error", bad.name)
				}
			}
		}
		// absorb_q_fast_..._n at DeepSeek-V3.2's and GLM-5's heads.
		if err := k.AbsorbFastSupported(); err != nil {
			t.Skipf("absorb module: %v", err)
		}
		const R, P = 512, 64
		for _, sh := range []struct{ H, nope, nss, K int }{{128, 128, 192, 1536}, {64, 192, 256, 2048}, {5, 32, 7, 100}} {
			H, nope := sh.H, sh.nope
			hs := nope + P
			q := a.up(randF32(r, H*hs, 1))
			ukp, uks, _ := randFP8Rows(r, a, H*nope, R)
			const maxPos = 40
			pos := []int32{int32(r.IntN(maxPos))}
			cosT, sinT := randF32(r, maxPos*P/2, 1), randF32(r, maxPos*P/2, 1)
			rope := QRope{Pos: a.up(pos), Cos: a.up(cosT), Sin: a.up(sinT)}
			part := randF32(r, sh.nss, 1)
			var sum float64
			for i := range part {
				part[i] = float32(math.Abs(float64(part[i]))) * float32(sh.K) / float32(sh.nss)
				sum += float64(part[i])
			}
			rq := 1 / math.Sqrt(sum/float64(sh.K)+eps)
			qs := QScale{SumSq: a.up(part), N: sh.nss, K: sh.K, Eps: eps}
			out1, qpe1 := a.poisoned(H*R), a.poisoned(H*P)
			out2, qpe2 := a.poisoned(H*R), a.poisoned(H*P)
			chk(k.AbsorbQFast(s, out1, qpe1, q, ukp, uks, H, nope, R, hs, P, rope))
			chk(k.AbsorbQFastScaled(s, out2, qpe2, q, ukp, uks, H, nope, R, hs, P, rope, qs))
			tag := fmt.Sprintf("absorb_q_fast_..._n H=%d nope=%d", H, nope)
			for _, o := range []struct {
				name  string
				d, n  cuda.DevPtr
				count int
			}{{"sums", out1, out2, H * R}, {"RoPE part", qpe1, qpe2, H * P}} {
				d, n := downF32(c, o.d, o.count), downF32(c, o.n, o.count)
				want := make([]float64, o.count)
				for i, v := range d {
					want[i] = float64(v) * rq
				}
				record(t, tag+" "+o.name+" vs the default times r", relMetric, relErr(n, want), 2e-6)
			}
			if err := k.AbsorbQFastScaled(s, out2, qpe2, q, ukp, uks, H, nope, R, hs, P, rope, QScale{}); err == nil {
				t.Errorf("%s: a zero QScale was taken", tag)
			}
		}
		// attn_epilogue_qs against attn_epilogue on the scaled query.
		{
			const maxPos, rot, nPages, IH = 4096, 64, 64, 64
			cosT, sinT := ropeTables(maxPos, rot)
			cp, sp := a.up(cosT), a.up(sinT)
			for _, il := range []bool{false, true} {
				pos := []int32{int32(r.IntN(nPages * 64))}
				pp := a.up(pos)
				kva, ik := randF32(r, 576, 2), randF32(r, 128, 1.5)
				iq, iw := randF32(r, IH*128, 1), randF32(r, IH, 1)
				kvw, ikw, ikb := a.up(randF32(r, 512, 1)), a.up(randF32(r, 128, 1)), a.up(randF32(r, 128, 0.3))
				mlaInit, idxInit := randBytes(r, nPages*64*MLATokenBytes), randBytes(r, nPages*IndexerPageBytes)
				part := randF32(r, 192, 1)
				var sum float64
				for i := range part {
					part[i] = float32(math.Abs(float64(part[i]))) * 8
					sum += float64(part[i])
				}
				rq := float32(1 / math.Sqrt(sum/1536+eps))
				iqs := make([]float32, len(iq))
				for i, v := range iq {
					iqs[i] = v * rq
				}
				const wscale = 0.0123
				run := func(q []float32, qs QScale) (kv, ikk, wq []float32, mla, idx, qh []byte) {
					kvp, ikp, mlap, idxp := a.up(kva), a.up(ik), a.up(mlaInit), a.up(idxInit)
					qhp, wqp := a.raw(int64(IndexerQRowBytes)), a.poisoned(IndexerQHeads)
					chk(k.AttnEpilogue(s, AttnEpilogue{KVA: kvp, LdKV: 576, KVNorm: kvw, KVEps: 1e-6, KVInterleaved: il, MLACache: mlap,
						IK: ikp, LdIK: 128, IKNormW: ikw, IKNormB: ikb, IKEps: 1e-6, IdxInterleaved: il, IdxCache: idxp,
						IQ: a.up(q), IW: a.up(iw), QH: qhp, WQ: wqp, IH: IH, WScale: wscale, Pos: pp, Cos: cp, Sin: sp, Rot: rot, Rows: 1, QS: qs}))
					return downF32(c, kvp, 576), downF32(c, ikp, 128), downF32(c, wqp, IndexerQHeads),
						downBytes(c, mlap, len(mlaInit)), downBytes(c, idxp, len(idxInit)), downBytes(c, qhp, IndexerQRowBytes)
				}
				kv1, ik1, wq1, mla1, idx1, qh1 := run(iqs, QScale{})
				kv2, ik2, wq2, mla2, idx2, qh2 := run(iq, QScale{SumSq: a.up(part), N: len(part), K: 1536, Eps: eps})
				tag := fmt.Sprintf("attn_epilogue_qs il=%v", il)
				bad := diffF32Bits(kv1, kv2) + diffF32Bits(ik1, ik2) + diffBytes(mla1, mla2) + diffBytes(idx1, idx2)
				record(t, tag+": block 0 vs attn_epilogue", "mismatched values", float64(bad), 0)
				codes := 0
				for i := range qh1 {
					if qh1[i] != qh2[i] {
						codes++
					}
				}
				record(t, tag+": query codes vs attn_epilogue on the query times r", "differing codes", float64(codes), float64(len(qh1)/500))
				w1 := make([]float64, len(wq1))
				for i, v := range wq1 {
					w1[i] = float64(v)
				}
				record(t, tag+": head weights vs attn_epilogue on the query times r", relMetric, relErr(wq2, w1), 2e-6)
			}
		}
		for _, n := range []struct {
			name string
			c    *atomic.Int64
			from int64
		}{{"gemv_group_r8_m1_qw", &GroupQWLaunches, g0}, {"absorb_q_fast_..._n", &AbsorbQScaledLaunches, s0}, {"attn_epilogue_qs", &AttnEpilogueQSLaunches, e0}} {
			if n.c.Load() == n.from {
				t.Errorf("%s never launched", n.name)
			}
		}
	})
}
