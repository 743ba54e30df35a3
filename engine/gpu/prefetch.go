package gpu

import (
	"os"

	"github.com/tilert-go/tilert/cuda/kernels"
)

// L2 prefetches of weights while the HBM would otherwise idle, by
// TILERT_GPU_L2PF ("1": both, "attn" or "in": one of them; opt-in until a
// device step shows them faster). The outputs do not change: prefetches
// only move bytes into the L2.
//   - attn: the attention epilogue's launch asks for what the layer reads
//     after the mostly latency-bound indexer scores, top-k and MLA: W_UK,
//     W_UV, the router and the first l2pfOProjMB MB of o_proj
//     (AttnEpilogue.Prefetch);
//   - in: a layer's closing add+norm asks for the next layer's first
//     grouped launch (q_a, kv_a, indexer wk, weights_proj), read right
//     after it, by kernels no more than ~1.3 TB/s busy.
var (
	l2pfMode    = os.Getenv("TILERT_GPU_L2PF")
	l2pfAttn    = l2pfMode == "1" || l2pfMode == "attn"
	l2pfIn      = l2pfMode == "1" || l2pfMode == "in"
	l2pfOProjMB = envInt("TILERT_GPU_L2PF_OPROJ_MB", 16)
)

// l2Ranges is what one launch prefetches (zero: nothing).
type l2Ranges = [kernels.MaxL2Prefetch]kernels.L2Range

// l2Prefetch is the ranges the first epilogue launch of layer lw prefetches
// (none unless l2pfMode is "1" and the weights are fp8 / bf16 as the
// serving path keeps them).
func (f *fwd) l2Prefetch(lw *dlayer) (r l2Ranges) {
	if !l2pfAttn {
		return r
	}
	c := f.e.cfg
	R := int64(c.KVLoraRank)
	if lw.uk.fp8 {
		r[0] = kernels.L2Range{P: lw.uk.w, Bytes: int64(c.NumHeads) * int64(c.QKNopeHeadDim) * R}
	}
	if lw.uv.fp8 {
		r[1] = kernels.L2Range{P: lw.uv.w, Bytes: int64(c.NumHeads) * int64(c.VHeadDim) * R}
	}
	if lw.MoE && lw.Router.kind == linBF16 {
		r[2] = kernels.L2Range{P: lw.Router.w, Bytes: 2 * int64(lw.Router.out) * int64(lw.Router.in)}
	}
	if lw.O.kind == linFP8 {
		r[3] = kernels.L2Range{P: lw.O.w, Bytes: min(int64(l2pfOProjMB)<<20, int64(lw.O.out)*int64(lw.O.in))}
	}
	return r
}

// linBytes is the bytes of l's weights (fp8 or bf16; 0 otherwise).
func linBytes(l dlin) int64 {
	switch l.kind {
	case linFP8:
		return int64(l.out) * int64(l.in)
	case linBF16:
		return 2 * int64(l.out) * int64(l.in)
	}
	return 0
}

// l2PrefetchIn is the ranges the closing norm before layer next prefetches:
// its q_a, kv_a and (with its own indexer) wk and weights_proj.
func (f *fwd) l2PrefetchIn(next *dlayer) (r l2Ranges) {
	if !l2pfIn || next == nil {
		return r
	}
	ls := []dlin{next.QA, next.KVA}
	if next.HasIdx {
		ls = append(ls, next.IWK, next.IWP)
	}
	for i, l := range ls {
		if n := linBytes(l); n > 0 {
			r[i] = kernels.L2Range{P: l.w, Bytes: n}
		}
	}
	return r
}
