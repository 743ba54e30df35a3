package gpu

import (
	"os"

	"github.com/tilert-go/tilert/cuda"
	"github.com/tilert-go/tilert/cuda/kernels"
)

// groupOn: TILERT_GPU_GROUP=0 keeps the attention-input projections as
// separate launches (q_a, rmsnorm, q_b, kv_a, and the indexer's wq_b, wk,
// weights_proj: 7 per layer) instead of two grouped launches (projGroup).
var groupOn = os.Getenv("TILERT_GPU_GROUP") != "0"

// projGroup runs the attention-input projections of ws.h as two launches
// (kernels.GemvGroup) when the weights allow: q_a, kv_a and, with the
// indexer, its wk and weights_proj, all reading ws.h; then q_b and the
// indexer's wq_b over q_a, each block normalising q_a itself (rmsnorm's
// arithmetic), so no rmsnorm launch and ws.qa stays unnormed (f.qaRaw;
// nothing else reads it once wq_b is done). Every output is bit-identical
// to the separate tile launches. It reports false, having launched
// nothing, where a projection is float32 (exact mode), the rows take the
// tensor-core GEMMs, the tile kernels are off, or the shapes do not fit.
func (f *fwd) projGroup(lw *dlayer, withIdx bool) bool {
	e, o, ws := f.e, f.o, f.e.ws
	c := e.cfg
	H, M := c.HiddenSize, f.M
	QL := c.QLoraRank
	if !groupOn || !gemvTileOn || QL == 0 {
		return false
	}
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
	if !kernels.GroupOK(ws.h, H, H, ins) || !kernels.GroupOK(ws.qa, QL, QL, qbs) {
		return false
	}
	norm := kernels.GroupNorm{W: lw.QANorm, Eps: subEps}
	for _, st := range []struct {
		x    ptrOf
		K    int
		segs []kernels.GroupSeg
		norm kernels.GroupNorm
	}{{ptrOf{ws.h, H}, H, ins, kernels.GroupNorm{}}, {ptrOf{ws.qa, QL}, QL, qbs, norm}} {
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
	f.idxProj, f.qaRaw = withIdx, true
	return true
}

// ptrOf is a row-major device matrix: its base and row stride (floats).
type ptrOf struct {
	p  cuda.DevPtr
	ld int
}
