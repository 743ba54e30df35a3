package kernels

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/tilert-go/tilert/cuda"
)

// Checks of cu/fused.cu: the fused launch against the launches it replaces
// on fresh random inputs, every output compared bit for bit (those launches
// have their own checks against CPU references).

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

// graphUs captures n runs of f into one graph and returns the median time
// of one run over replays (what the engine's decode graphs see).
func graphUs(c *cuda.Ctx, s cuda.Stream, n int, f func()) float64 {
	return graphUsRot(c, s, n, 21, func(int) { f() })
}

// TestKernelFusedTiming times the fused launch against the launches it
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
		}
	})
}

func TestFusedLaunchesDefined(t *testing.T) { checkLaunchesDefined(t, "fused.go", 1) }
