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

// randBytes is n random bytes (stale cache contents a kernel must leave
// alone or overwrite).
func randBytes(r *rand.Rand, n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(r.Uint32())
	}
	return b
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
			mlaInit, idxInit := randBytes(r, nPages*64*MLATokenBytes), randBytes(r, nPages*IndexerPageBytes)
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

// TestKernelFusedAttnEpilogueRows: the rows form (attn_epilogue_rows, one
// launch for rows of several slots, each row's caches at its slot buffer's
// base + the layer's offsets) against the one-cache form launched per
// group of consecutive same-slot rows, as the engine does without the
// merge: four slot buffers allocated apart (random spacers, shuffled
// order), rows of the slots interleaved at different positions (one at
// -1 where no query is prepared). Every byte of every slot buffer (caches and what lies around
// them) and every output row compared bit for bit.
func TestKernelFusedAttnEpilogueRows(t *testing.T) {
	onGPU(t, func(c *cuda.Ctx, k *Set, a *allocs, r *rand.Rand) {
		s := c.Stream()
		const maxPos, rot, nPages, IH, nSlots = 4096, 64, 64, 64, 4
		cosT, sinT := ropeTables(maxPos, rot)
		cp, sp := a.up(cosT), a.up(sinT)
		// the layer's offsets in every slot's buffer (the engine's
		// mlaOff / idxOff); bytes before and between them must stay
		const mlaOff = 4096 + 256
		idxOff := int64(mlaOff + nPages*64*MLATokenBytes + 512)
		bufBytes := int(idxOff) + nPages*IndexerPageBytes + 256
		// the rows' slots: groups of consecutive same-slot rows, a slot in
		// several groups
		slotOf := []int{2, 2, 0, 3, 1, 1, 1, 0, 2, 3}
		for _, cs := range []struct {
			kv, idx, q  bool
			kvIL, idxIL bool
			ldkvPad     int
		}{
			{true, true, true, true, false, 0},
			{true, true, true, false, true, 4},
			{true, false, false, true, false, 0}, // attnIn alone
			{false, true, true, false, false, 8}, // the indexer alone
			{false, true, false, true, true, 0},
		} {
			M := len(slotOf)
			ldkv, ldik := 576+cs.ldkvPad, 128+cs.ldkvPad
			// distinct positions within a slot; one row at -1 (writes
			// nothing) where no query is prepared (idx_q_prep reads the
			// RoPE tables at the row's position)
			pos := make([]int32, M)
			perm := r.Perm(nPages * 64)
			for i := range pos {
				pos[i] = int32(perm[i])
			}
			if !cs.q {
				pos[r.IntN(M)] = -1
			}
			pp := a.up(pos)
			kva := randF32(r, M*ldkv, 2)
			ik := randF32(r, M*ldik, 1.5)
			iq, iw := a.up(randF32(r, M*IH*128, 1)), a.up(randF32(r, M*IH, 1))
			kvw := a.up(randF32(r, 512, 1))
			ikw, ikb := a.up(randF32(r, 128, 1)), a.up(randF32(r, 128, 0.3))
			init := make([][]byte, nSlots)
			for i := range init {
				init[i] = make([]byte, bufBytes)
				for j := range init[i] {
					init[i][j] = byte(r.Uint32())
				}
			}
			// per-group launches' and the rows launch's slot buffers, apart
			var buf1, buf2 [nSlots]cuda.DevPtr
			for _, i := range r.Perm(2 * nSlots) {
				a.raw(int64(256 * (1 + r.IntN(64))))
				if i < nSlots {
					buf1[i] = a.up(init[i])
				} else {
					buf2[i-nSlots] = a.up(init[i-nSlots])
				}
			}
			const wscale = 0.0123
			base := func(ep *AttnEpilogue, first, n int, kv, ik, qh, wq cuda.DevPtr) {
				*ep = AttnEpilogue{KVA: kv.Add(int64(4 * first * ldkv)), LdKV: ldkv, KVNorm: kvw, KVEps: 1e-6, KVInterleaved: cs.kvIL,
					IK: ik.Add(int64(4 * first * ldik)), LdIK: ldik, IKNormW: ikw, IKNormB: ikb, IKEps: 1e-6, IdxInterleaved: cs.idxIL,
					IQ: iq.Add(int64(4 * first * IH * 128)), IW: iw.Add(int64(4 * first * IH)), IH: IH, WScale: wscale,
					Pos: pp.Add(int64(4 * first)), Cos: cp, Sin: sp, Rot: rot, Rows: n}
				if cs.q {
					ep.QH, ep.WQ = qh.Add(int64(first*IndexerQRowBytes)), wq.Add(int64(4*first*IndexerQHeads))
				}
			}
			// per group
			kv1, ik1 := a.up(kva), a.up(ik)
			qh1, wq1 := a.raw(int64(M*IndexerQRowBytes)), a.poisoned(M*IndexerQHeads)
			groups := 0
			for first := 0; first < M; {
				n := 1
				for first+n < M && slotOf[first+n] == slotOf[first] {
					n++
				}
				var ep AttnEpilogue
				base(&ep, first, n, kv1, ik1, qh1, wq1)
				if cs.kv {
					ep.MLACache = buf1[slotOf[first]].Add(mlaOff)
				}
				if cs.idx {
					ep.IdxCache = buf1[slotOf[first]].Add(idxOff)
				}
				chk(k.AttnEpilogue(s, ep))
				first += n
				groups++
			}
			// rows: one launch
			kv2, ik2 := a.up(kva), a.up(ik)
			qh2, wq2 := a.raw(int64(M*IndexerQRowBytes)), a.poisoned(M*IndexerQHeads)
			bases := make([]int64, M)
			for i, sl := range slotOf {
				bases[i] = int64(buf2[sl])
			}
			var ep AttnEpilogue
			base(&ep, 0, M, kv2, ik2, qh2, wq2)
			ep.Bases = a.up(bases)
			if cs.kv {
				ep.MLARows, ep.MLAOff = true, mlaOff
			}
			if cs.idx {
				ep.IdxRows, ep.IdxOff = true, idxOff
			}
			chk(k.AttnEpilogue(s, ep))
			tag := fmt.Sprintf("rows=%d groups=%d kv=%v idx=%v q=%v il=%v/%v", M, groups, cs.kv, cs.idx, cs.q, cs.kvIL, cs.idxIL)
			bad := diffF32Bits(downF32(c, kv1, M*ldkv), downF32(c, kv2, M*ldkv)) +
				diffF32Bits(downF32(c, ik1, M*ldik), downF32(c, ik2, M*ldik))
			changed := 0
			for i := range nSlots {
				b1 := downBytes(c, buf1[i], bufBytes)
				bad += diffBytes(b1, downBytes(c, buf2[i], bufBytes))
				changed += diffBytes(b1, init[i])
			}
			if cs.q {
				bad += diffBytes(downBytes(c, qh1, M*IndexerQRowBytes), downBytes(c, qh2, M*IndexerQRowBytes))
				bad += diffF32Bits(downF32(c, wq1, M*IndexerQHeads), downF32(c, wq2, M*IndexerQHeads))
			}
			if changed == 0 && (cs.kv || cs.idx) {
				t.Errorf("%s: the per-group launches wrote no cache byte", tag)
			}
			record(t, "attn_epilogue_rows vs attn_epilogue per group "+tag, "mismatched values", float64(bad), 0)
		}
	})
}

// TestAttnEpilogueCheckRows: Check refuses a rows form mixed with the
// one-cache form, offsets without row bases or for a part that is off.
func TestAttnEpilogueCheckRows(t *testing.T) {
	ok := AttnEpilogue{KVA: 1, LdKV: 576, KVNorm: 1, IK: 1, LdIK: 128, Pos: 1, Cos: 1, Sin: 1, Rot: 64, Rows: 3,
		Bases: 8, MLARows: true, MLAOff: 4096, IdxRows: true, IdxOff: 1 << 20}
	if err := ok.Check(); err != nil {
		t.Fatalf("rows form refused: %v", err)
	}
	for _, bad := range []func(a *AttnEpilogue){
		func(a *AttnEpilogue) { a.Bases = 0 },
		func(a *AttnEpilogue) { a.Bases, a.MLARows, a.IdxRows, a.IdxOff = 0, false, false, 0 },
		func(a *AttnEpilogue) { a.MLACache = 64 },
		func(a *AttnEpilogue) { a.IdxCache = 64 },
		func(a *AttnEpilogue) { a.MLARows = false },
		func(a *AttnEpilogue) { a.MLAOff = -8 },
		func(a *AttnEpilogue) { a.IdxRows, a.IdxOff, a.LdIK = true, 0, 64 },
	} {
		a := ok
		bad(&a)
		if err := a.Check(); err == nil {
			t.Errorf("accepted %+v", a)
		}
	}
	// the kv part from MLARows alone still needs its shapes
	a := ok
	a.IdxRows, a.IdxOff, a.Rot = false, 0, 32
	if err := a.Check(); err == nil {
		t.Errorf("kv part with rot 32 accepted")
	}
}

// directAndGraph times f both ways into a timingTable: 20 direct launches
// (median of 21 rounds) and inside a CUDA graph (graphUs).
func directAndGraph(c *cuda.Ctx, s cuda.Stream, add func(name string, bytes, us float64, comment string)) func(string, float64, func()) {
	return func(name string, bytes float64, f func()) {
		add(name+" direct", bytes, medianUs(c, s, 20, 21, f), "")
		add(name+" graph", bytes, graphUs(c, s, 20, f), "")
	}
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
		both := directAndGraph(c, s, add)
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
