package gpu

import (
	"os"

	"github.com/tilert-go/tilert/cuda"
	"github.com/tilert-go/tilert/cuda/kernels"
)

// groupMode picks how the attention-input projections launch (projGroup):
// "0" as separate launches (q_a, rmsnorm, q_b, kv_a, and the indexer's
// wq_b, wk, weights_proj: 7 per layer); by default q_a, kv_a, wk and
// weights_proj of the layer input as one grouped launch, then rmsnorm, q_b
// and wq_b as before (4); "2" also q_b and wq_b as one grouped launch with
// q_a's RMSNorm in every block's prologue (2). The H200 run of
// docs/measured/h200-2026-12-01-attnin timed both grouped launches faster
// than the launches they replace with tile rule 1's group sizes (9.8 vs
// 19.8 us and 21.7 vs 33.2 us at 1 row, in a graph); the normed launch's
// cost grows with its block count (every block repeats the prologue:
// 47.2 us at 4x the blocks), and with rule 3's group sizes (twice rule 1's
// blocks for K = 1536) it was not measured, so it stays opt-in.
//
// "3" groups q_b and wq_b too, without the prologue, after the separate
// rmsnorm of q_a (3 launches). Graph-timed on the H200 (helper fuse,
// docs/measured/h200-2026-12-01-fuse run 1, tile rule 3, weights cold, 1
// row): rmsnorm + that grouped launch 22.98 us against 24.47 for rmsnorm +
// the two tile GEMVs (the default) and 25.48 for mode 2 (its prologue,
// with its loads issued four at a time, still costs more than the 1.9 us
// rmsnorm launch). The engine wiring of mode 3 has not run on a GPU (the
// emulator checks it), so it is opt-in.
var groupMode = os.Getenv("TILERT_GPU_GROUP")

// projGroup runs the attention-input projections of ws.h as grouped
// launches (kernels.GemvGroup) when the weights allow, by groupMode: q_a,
// kv_a and, withIdx, the indexer's wk and weights_proj in one launch; then
// either the normed q_a and q_b as before (the indexer's wq_b follows in
// indexerProj), or (mode 2) q_b and, withIdx, wq_b over the unnormed q_a
// in one launch that normalises it in each block with rmsnorm's
// arithmetic, leaving ws.qa unnormed (f.qaRaw; nothing else reads it once
// wq_b is done). Every output is bit-identical to the separate tile
// launches. It reports false, having launched nothing, where a projection
// is float32 (exact mode), the rows take the tensor-core GEMMs, the tile
// kernels are off, or the shapes do not fit.
func (f *fwd) projGroup(lw *dlayer, withIdx bool) bool {
	e, o, ws := f.e, f.o, f.e.ws
	c := e.cfg
	H, M := c.HiddenSize, f.M
	QL := c.QLoraRank
	if groupMode == "0" || !gemvTileOn || QL == 0 {
		return false
	}
	// TILERT_GPU_GEMV_MID=1 (gemv_mid.go) takes this form at one row.
	normed := groupMode == "2" || midNormed(M)
	// After the separate rmsnorm, q_b (and wq_b) as one grouped launch
	// (mode 3) or as tile GEMVs (the default).
	// TILERT_GPU_GEMV_MID=2 (gemv_mid.go) groups them at one row as well.
	// With the side stream's q_b (sideQ, below) q_b leaves the group: it
	// streams beside the indexer's chain, whose wq_b stays on the main
	// stream.
	qbGroup := (groupMode == "3" || midQBGroup(M)) && !(sideQOn && withIdx && M <= kernels.MaxTileM)
	in := []dlin{lw.QA, lw.KVA}
	qb := []dlin{lw.QB}
	if withIdx {
		in = append(in, lw.IWK, lw.IWP)
		qb = append(qb, lw.IWQ)
	}
	for _, l := range append(append([]dlin(nil), in...), qb...) {
		if l.kind == linF32 || useGemm(l, M) || (l.kind == linFP8 && l.s == 0) {
			return false
		}
	}
	seg := func(l dlin, y ptrOf) kernels.GroupSeg {
		return kernels.GroupSeg{W: l.w, S: l.s, Y: y.p, N: l.out, LdY: y.ld, BF16: l.kind == linBF16}
	}
	ins := []kernels.GroupSeg{seg(lw.QA, ptrOf{ws.qa, QL}), seg(lw.KVA, ptrOf{ws.kva, lw.KVA.out})}
	qbs := []kernels.GroupSeg{seg(lw.QB, ptrOf{ws.q, lw.QB.out})}
	if withIdx {
		ins = append(ins, seg(lw.IWK, ptrOf{ws.ik, lw.IWK.out}), seg(lw.IWP, ptrOf{ws.iw, lw.IWP.out}))
		qbs = append(qbs, seg(lw.IWQ, ptrOf{ws.iq, lw.IWQ.out}))
	}
	if !kernels.GroupOK(ws.h, H, H, ins) || (normed && !kernels.GroupOK(ws.qa, QL, QL, qbs)) {
		return false
	}
	// TILERT_GPU_QA_NORM=late (qa_norm.go): q_a leaves the group times its
	// norm weight, with its sums of squares, and absorbQ applies the scale.
	if !normed && lw.uk.fp8 && lw.QANorm != 0 && (!withIdx || f.fuseIdx()) {
		P := c.QKRopeHeadDim
		nope := c.QKNopeHeadDim
		if n := o.b.qaLate(M, ins[0], H, nope, c.KVLoraRank, nope+P, P); n > 0 && n <= QL {
			ins[0].OutW, ins[0].SumSq = lw.QANorm, ws.qss
			f.qaScale = kernels.QScale{SumSq: ws.qss, N: n, K: QL, Eps: subEps}
		}
	}
	qbGroup = qbGroup && kernels.GroupOK(ws.qa, QL, QL, qbs)
	type stage struct {
		x    ptrOf
		K    int
		segs []kernels.GroupSeg
		norm kernels.GroupNorm
	}
	stages := []stage{{ptrOf{ws.h, H}, H, ins, kernels.GroupNorm{}}}
	if normed {
		stages = append(stages, stage{ptrOf{ws.qa, QL}, QL, qbs, kernels.GroupNorm{W: lw.QANorm, Eps: subEps}})
	}
	for _, st := range stages {
		rows := kernels.MaxTileM
		if st.norm.W != 0 {
			rows = kernels.GroupNormRows
		}
		for r := 0; r < M && o.err == nil; r += rows {
			m := min(rows, M-r)
			segs := make([]kernels.GroupSeg, len(st.segs))
			for i, sg := range st.segs {
				sg.Y = fptr(sg.Y, r*sg.LdY)
				segs[i] = sg
			}
			o.do(o.b.gemvGroup(fptr(st.x.p, r*st.x.ld), st.K, m, st.x.ld, segs, st.norm))
		}
	}
	f.idxKW = withIdx
	if normed {
		f.idxQB, f.qaRaw = withIdx, true
		return true
	}
	if !f.qaScale.On() {
		o.do(o.b.rmsnorm(ws.qa, ws.qa, lw.QANorm, M, QL, QL, QL, subEps))
	}
	if qbGroup {
		for r := 0; r < M && o.err == nil; r += kernels.MaxTileM {
			m := min(kernels.MaxTileM, M-r)
			segs := make([]kernels.GroupSeg, len(qbs))
			for i, sg := range qbs {
				sg.Y = fptr(sg.Y, r*sg.LdY)
				segs[i] = sg
			}
			o.do(o.b.gemvGroup(fptr(ws.qa, r*QL), QL, m, QL, segs, kernels.GroupNorm{}))
		}
		f.idxQB = withIdx
		return true
	}
	if sideQOn && withIdx && M <= kernels.MaxTileM {
		// q_b and the query absorption beside the indexer's chain (side.go;
		// attnOut joins before the MLA), or beside its top-k alone
		// (qLate: idxSelect forks them after the scores launch).
		if late, before := f.qLate(); late {
			f.qPending, f.qBefore = true, before
			return true
		}
		f.qBeside(lw, chainQ)
		return true
	}
	o.lin(lw.QB, ws.q, ws.qa, M, QL, lw.QB.out)
	return true
}

// ptrOf is a row-major device matrix: its base and row stride (floats).
type ptrOf struct {
	p  cuda.DevPtr
	ld int
}

// qBeside queues q_b and the query absorption of ws.qa on the side stream
// (attnOut joins before the MLA).
func (f *fwd) qBeside(lw *dlayer, ch sideChain) {
	o, ws := f.o, f.e.ws
	o.do(o.b.fork(ch, f.M))
	if !f.qbAbsorb(lw) { // TILERT_GPU_QB_ABSORB (qb_absorb.go)
		o.lin(lw.QB, ws.q, ws.qa, f.M, f.e.cfg.QLoraRank, lw.QB.out)
		f.absorbQ(lw)
	}
	o.do(o.b.unfork())
	f.sideQ = true
}
