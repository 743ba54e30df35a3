package kernels

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/tilert-go/tilert/cuda"
)

// Checks of cu/fused.cu: each fused launch against the launches it replaces
// on fresh random inputs, every output compared bit for bit (those launches
// have their own checks against CPU references), plus float64 references
// where the fused kernel computes something new (the router logits).

func ropeTables(maxPos, rot int) (cosT, sinT []float32) {
	half := rot / 2
	cosT, sinT = make([]float32, maxPos*half), make([]float32, maxPos*half)
	for p := range maxPos {
		for i := range half {
			th := float64(p) * math.Pow(10000, -float64(2*i)/float64(rot))
			cosT[p*half+i], sinT[p*half+i] = float32(math.Cos(th)), float32(math.Sin(th))
		}
	}
	return cosT, sinT
}

func downBytes(c *cuda.Ctx, p cuda.DevPtr, n int) []byte {
	out := make([]byte, n)
	chk(c.Download(out, p))
	return out
}

func diffF32Bits(a, b []float32) int {
	n := 0
	for i := range a {
		if math.Float32bits(a[i]) != math.Float32bits(b[i]) {
			n++
		}
	}
	return n
}

func TestKernelFusedAttnEpilogue(t *testing.T) {
	onGPU(t, func(c *cuda.Ctx, k *Set, a *allocs, r *rand.Rand) {
		s := c.Stream()
		const maxPos, rot, nPages, IH = 4096, 64, 64, 64
		cosT, sinT := ropeTables(maxPos, rot)
		cp, sp := a.up(cosT), a.up(sinT)
		for _, cs := range []struct {
			rows           int
			kv, idx, q     bool
			kvIL, idxIL    bool
			ldkvPad, ldPad int
		}{
			{1, true, true, true, true, false, 0, 0},
			{2, true, true, true, true, false, 4, 8},
			{3, true, true, true, false, true, 0, 0},
			{4, true, true, true, true, false, 8, 0},
			{5, true, true, true, true, true, 0, 4},
			{8, true, true, true, true, false, 0, 0},
			{3, true, false, false, true, false, 0, 0}, // attnIn alone (shard ranks)
			{2, false, true, true, false, false, 0, 0}, // the indexer alone
			{4, false, true, false, false, true, 0, 0},
		} {
			M := cs.rows
			ldkv, ldik := 576+cs.ldkvPad, 128+cs.ldPad
			pos := make([]int32, M)
			for i, p := range r.Perm(nPages * 64)[:M] {
				pos[i] = int32(p)
			}
			pp := a.up(pos)
			kva := randF32(r, M*ldkv, 2)
			ik := randF32(r, M*ldik, 1.5)
			iq := randF32(r, M*IH*128, 1)
			iw := randF32(r, M*IH, 1)
			kvw := randF32(r, 512, 1)
			ikw, ikb := randF32(r, 128, 1), randF32(r, 128, 0.3)
			mlaInit := make([]byte, nPages*64*MLATokenBytes)
			idxInit := make([]byte, nPages*IndexerPageBytes)
			for i := range mlaInit {
				mlaInit[i] = byte(r.Uint32())
			}
			for i := range idxInit {
				idxInit[i] = byte(r.Uint32())
			}
			kvwp, ikwp, ikbp, iqp, iwp := a.up(kvw), a.up(ikw), a.up(ikb), a.up(iq), a.up(iw)
			const wscale = 0.0123
			// the launches the fused kernel replaces
			kv1, ik1, mla1, idx1 := a.up(kva), a.up(ik), a.up(mlaInit), a.up(idxInit)
			qh1, wq1 := a.raw(int64(M*IndexerQRowBytes)), a.poisoned(M*IndexerQHeads)
			if cs.kv {
				chk(k.RMSNorm(s, kv1, kv1, kvwp, M, 512, ldkv, ldkv, 1e-6))
				chk(k.RoPE(s, kv1, pp, cp, sp, M, 1, ldkv, 512, rot, cs.kvIL))
				chk(k.EngMLACacheWrite(s, mla1, kv1, pp, M, ldkv))
			}
			if cs.idx {
				chk(k.LayerNorm(s, ik1, ik1, ikwp, ikbp, M, 128, ldik, ldik, 1e-6))
				chk(k.RoPE(s, ik1, pp, cp, sp, M, 1, ldik, 0, rot, cs.idxIL))
				chk(k.EngIndexerCacheWrite(s, idx1, ik1, pp, M, ldik))
			}
			if cs.q {
				chk(k.IndexerQPrep(s, qh1, wq1, iqp, iwp, pp, cp, sp, M, IH, rot, cs.idxIL, wscale))
			}
			// fused
			kv2, ik2, mla2, idx2 := a.up(kva), a.up(ik), a.up(mlaInit), a.up(idxInit)
			qh2, wq2 := a.raw(int64(M*IndexerQRowBytes)), a.poisoned(M*IndexerQHeads)
			ep := AttnEpilogue{KVA: kv2, LdKV: ldkv, KVNorm: kvwp, KVEps: 1e-6, KVInterleaved: cs.kvIL,
				IK: ik2, LdIK: ldik, IKNormW: ikwp, IKNormB: ikbp, IKEps: 1e-6, IdxInterleaved: cs.idxIL,
				IQ: iqp, IW: iwp, IH: IH, WScale: wscale, Pos: pp, Cos: cp, Sin: sp, Rot: rot, Rows: M}
			if cs.kv {
				ep.MLACache = mla2
			}
			if cs.idx {
				ep.IdxCache = idx2
			}
			if cs.q {
				ep.QH, ep.WQ = qh2, wq2
			}
			chk(k.AttnEpilogue(s, ep))
			tag := fmt.Sprintf("rows=%d kv=%v idx=%v q=%v il=%v/%v", M, cs.kv, cs.idx, cs.q, cs.kvIL, cs.idxIL)
			bad := diffF32Bits(downF32(c, kv1, M*ldkv), downF32(c, kv2, M*ldkv)) +
				diffF32Bits(downF32(c, ik1, M*ldik), downF32(c, ik2, M*ldik))
			bad += diffBytes(downBytes(c, mla1, len(mlaInit)), downBytes(c, mla2, len(mlaInit)))
			bad += diffBytes(downBytes(c, idx1, len(idxInit)), downBytes(c, idx2, len(idxInit)))
			if cs.q {
				bad += diffBytes(downBytes(c, qh1, M*IndexerQRowBytes), downBytes(c, qh2, M*IndexerQRowBytes))
				bad += diffF32Bits(downF32(c, wq1, M*IndexerQHeads), downF32(c, wq2, M*IndexerQHeads))
			}
			record(t, "attn_epilogue vs rmsnorm+rope+mla write, layernorm+rope+idx write, idx_q_prep "+tag, "mismatched values", float64(bad), 0)
		}
	})
}

func TestKernelFusedRouterRoute(t *testing.T) {
	onGPU(t, func(c *cuda.Ctx, k *Set, a *allocs, r *rand.Rand) {
		s := c.Stream()
		counter := a.up([]uint32{0})
		for _, cs := range []struct {
			E, K, topk, ngroup, topkGroup int
			norm                          bool
			bias                          bool
		}{
			{256, 7168, 8, 8, 4, true, true}, // DeepSeek-V3.2
			{64, 512, 6, 1, 1, true, false},
			{160, 1024, 8, 4, 2, false, true},
		} {
			E, K := cs.E, cs.K
			wb := randBF16(r, E*K, 0.05)
			w := a.up(wb)
			biasv := randF32(r, E, 0.1)
			bias := cuda.DevPtr(0)
			if cs.bias {
				bias = a.up(biasv)
			}
			for M := 1; M <= RouterRouteMaxRows; M++ {
				ldx := K + 4*(M%2)
				x := randF32(r, M*ldx, 1)
				xp := a.up(x)
				// unfused: the wide GEMV (at most 4 rows a launch) then the router
				lg1, idx1, wt1 := a.poisoned(M*E), a.poisoned(M*cs.topk), a.poisoned(M*cs.topk)
				for r0 := 0; r0 < M; r0 += 4 {
					m := min(4, M-r0)
					chk(k.GemvBF16Wide(s, lg1.Add(int64(4*r0*E)), xp.Add(int64(4*r0*ldx)), w, 0, E, K, m, ldx, E))
				}
				chk(k.MoERoute(s, idx1, wt1, lg1, bias, M, E, cs.topk, cs.ngroup, cs.topkGroup, cs.norm, 2.5))
				lg2, idx2, wt2 := a.poisoned(M*E), a.poisoned(M*cs.topk), a.poisoned(M*cs.topk)
				for rep := 0; rep < 2; rep++ { // the second launch needs the counter reset by the first
					chk(k.RouterRoute(s, idx2, wt2, lg2, xp, w, bias, counter, E, K, M, ldx, cs.topk, cs.ngroup, cs.topkGroup, cs.norm, 2.5))
				}
				tag := fmt.Sprintf("E=%d K=%d M=%d topk=%d groups %d/%d", E, K, M, cs.topk, cs.ngroup, cs.topkGroup)
				g1, g2 := downF32(c, lg1, M*E), downF32(c, lg2, M*E)
				bad := diffF32Bits(g1, g2) + diffF32Bits(downF32(c, wt1, M*cs.topk), downF32(c, wt2, M*cs.topk))
				i1, i2 := downI32(c, idx1, M*cs.topk), downI32(c, idx2, M*cs.topk)
				for i := range i1 {
					if i1[i] != i2[i] {
						bad++
					}
				}
				if cnt := downI32(c, counter, 1)[0]; cnt != 0 {
					bad += 1000
				}
				record(t, "router_route vs gemv_bf16_wide+moe_route "+tag, "mismatched values", float64(bad), 0)
				ref := refGemv(func(n, kk int) float64 { return bf16ToF64(wb[n*K+kk]) }, x, nil, E, K, M, ldx, E)
				record(t, "router_route logits vs float64 "+tag, relMetric, relErr(g2, ref), boundF32)
			}
		}
	})
}

func TestKernelFusedMoECombineNorm(t *testing.T) {
	onGPU(t, func(c *cuda.Ctx, k *Set, a *allocs, r *rand.Rand) {
		s := c.Stream()
		for _, cs := range []struct {
			D, k  int
			resid bool
		}{{7168, 8, true}, {7168, 8, false}, {1000, 3, true}, {6144, 8, true}} {
			for _, M := range []int{1, 2, 3, 4, 8} {
				D, kk := cs.D, cs.k
				ldx, ldy := D+4, D+8
				y := a.up(randF32(r, M*kk*D, 1))
				wv := a.up(randF32(r, M*kk, 0.3))
				resid := cuda.DevPtr(0)
				if cs.resid {
					resid = a.up(randF32(r, M*D, 1))
				}
				nw := a.up(randF32(r, D, 1))
				x0 := randF32(r, M*ldx, 3)
				x1, out1, tmp := a.up(x0), a.poisoned(M*ldy), a.raw(int64(4*M*D))
				chk(k.MoECombineSlots(s, tmp, y, wv, resid, M, kk, D))
				chk(k.AddRMSNorm(s, out1, x1, tmp, nw, M, D, ldx, D, ldy, 1e-6))
				x2, out2 := a.up(x0), a.poisoned(M*ldy)
				chk(k.MoECombineAddRMSNorm(s, out2, x2, y, wv, resid, nw, M, kk, D, ldx, ldy, 1e-6))
				o1, o2 := downF32(c, out1, M*ldy), downF32(c, out2, M*ldy)
				bad := diffF32Bits(downF32(c, x1, M*ldx), downF32(c, x2, M*ldx))
				for i := range o1 { // padding columns stay NaN in both
					if math.Float32bits(o1[i]) != math.Float32bits(o2[i]) {
						bad++
					}
				}
				record(t, fmt.Sprintf("moe_combine_add_rmsnorm vs moe_combine_slots+add_rmsnorm D=%d k=%d M=%d resid=%v", D, kk, M, cs.resid),
					"mismatched values", float64(bad), 0)
			}
		}
	})
}

// graphUs captures n runs of f into one graph and returns the median time
// of one run over replays (what the engine's decode graphs see).
func graphUs(c *cuda.Ctx, s cuda.Stream, n int, f func()) float64 {
	return graphUsRot(c, s, n, 21, func(int) { f() })
}

// TestKernelFusedTiming times each fused launch against the launches it
// replaces, DeepSeek-V3.2 dims, direct launches and inside a CUDA graph.
func TestKernelFusedTiming(t *testing.T) {
	needTiming(t)
	onGPU(t, func(c *cuda.Ctx, k *Set, a *allocs, r *rand.Rand) {
		s := c.Stream()
		add := timingTable(t, c, a, r, 256<<20, "fused: device-to-device copy 256 MiB (read+write)", "reference of this table")
		both := func(name string, bytes float64, f func()) {
			add(name+" direct", bytes, medianUs(c, s, 20, 21, f), "")
			add(name+" graph", bytes, graphUs(c, s, 20, f), "")
		}
		const maxPos, rot, IH = 4096, 64, 64
		cosT, sinT := ropeTables(maxPos, rot)
		cp, sp := a.up(cosT), a.up(sinT)
		for _, M := range []int{1, 4} {
			pos := make([]int32, M)
			for i := range pos {
				pos[i] = int32(1000 + i)
			}
			pp := a.up(pos)
			kv, ik := a.up(randF32(r, M*576, 1)), a.up(randF32(r, M*128, 1))
			iq, iw := a.up(randF32(r, M*IH*128, 1)), a.up(randF32(r, M*IH, 1))
			kvw, ikw, ikb := a.up(randF32(r, 512, 1)), a.up(randF32(r, 128, 1)), a.up(randF32(r, 128, 1))
			mla, idx := a.raw(int64(64*64*MLATokenBytes)), a.raw(int64(64*IndexerPageBytes))
			qh, wq := a.raw(int64(M*IndexerQRowBytes)), a.raw(int64(4*M*IndexerQHeads))
			bytes := float64(M * (4*576*2 + 656 + 4*128*2 + 132 + 4*IH*129 + IndexerQRowBytes + 4*64))
			both(fmtName("attn epilogue unfused (7 launches) M=%d", M), bytes, func() {
				chk(k.RMSNorm(s, kv, kv, kvw, M, 512, 576, 576, 1e-6))
				chk(k.RoPE(s, kv, pp, cp, sp, M, 1, 576, 512, rot, true))
				chk(k.EngMLACacheWrite(s, mla, kv, pp, M, 576))
				chk(k.LayerNorm(s, ik, ik, ikw, ikb, M, 128, 128, 128, 1e-6))
				chk(k.RoPE(s, ik, pp, cp, sp, M, 1, 128, 0, rot, false))
				chk(k.EngIndexerCacheWrite(s, idx, ik, pp, M, 128))
				chk(k.IndexerQPrep(s, qh, wq, iq, iw, pp, cp, sp, M, IH, rot, false, 0.01))
			})
			ep := AttnEpilogue{KVA: kv, LdKV: 576, KVNorm: kvw, KVEps: 1e-6, MLACache: mla, KVInterleaved: true,
				IK: ik, LdIK: 128, IKNormW: ikw, IKNormB: ikb, IKEps: 1e-6, IdxCache: idx,
				IQ: iq, IW: iw, QH: qh, WQ: wq, IH: IH, WScale: 0.01, Pos: pp, Cos: cp, Sin: sp, Rot: rot, Rows: M}
			both(fmtName("attn_epilogue fused M=%d", M), bytes, func() { chk(k.AttnEpilogue(s, ep)) })

			const E, K, topk = 256, 7168, 8
			w := a.up(randBF16(r, E*K, 0.05))
			x := a.up(randF32(r, M*K, 1))
			bias := a.up(randF32(r, E, 0.1))
			lg, ids, wts := a.raw(int64(4*M*E)), a.raw(int64(4*M*topk)), a.raw(int64(4*M*topk))
			counter := a.up([]uint32{0})
			rb := float64(2*E*K + 4*M*K + 4*M*E)
			both(fmtName("router gemv_bf16_wide + moe_route (2 launches) M=%d", M), rb, func() {
				chk(k.GemvBF16Wide(s, lg, x, w, 0, E, K, M, K, E))
				chk(k.MoERoute(s, ids, wts, lg, bias, M, E, topk, 8, 4, true, 2.5))
			})
			both(fmtName("router_route fused M=%d", M), rb, func() {
				chk(k.RouterRoute(s, ids, wts, lg, x, w, bias, counter, E, K, M, K, topk, 8, 4, true, 2.5))
			})

			const D = 7168
			y := a.up(randF32(r, M*topk*D, 1))
			ew := a.up(randF32(r, M*topk, 0.3))
			res := a.up(randF32(r, M*D, 1))
			nw := a.up(randF32(r, D, 1))
			xr, out, tmp := a.up(randF32(r, M*D, 1)), a.raw(int64(4*M*D)), a.raw(int64(4*M*D))
			cb := float64(4 * M * D * (topk + 1 + 2 + 1))
			both(fmtName("moe_combine_slots + add_rmsnorm (2 launches) M=%d", M), cb, func() {
				chk(k.MoECombineSlots(s, tmp, y, ew, res, M, topk, D))
				chk(k.AddRMSNorm(s, out, xr, tmp, nw, M, D, D, D, D, 1e-6))
			})
			both(fmtName("moe_combine_add_rmsnorm fused M=%d", M), cb, func() {
				chk(k.MoECombineAddRMSNorm(s, out, xr, y, ew, res, nw, M, topk, D, D, D, 1e-6))
			})
		}
	})
}

func TestFusedLaunchesDefined(t *testing.T) { checkLaunchesDefined(t, "fused.go", 3) }
