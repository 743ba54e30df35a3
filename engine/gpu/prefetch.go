package gpu

import (
	"os"

	"github.com/tilert-go/tilert/cuda/kernels"
)

// l2pfMode: "1" lets the attention epilogue's launch ask the L2 for the
// weights that the layer reads next while mostly latency-bound kernels run
// (indexer scores, top-k, MLA): W_UK, W_UV, the router and the first
// l2pfOProjMB MB of o_proj (AttnEpilogue.Prefetch). Opt-in until a device
// step shows it faster; the outputs do not change (prefetches only move
// bytes into the L2).
var (
	l2pfMode    = os.Getenv("TILERT_GPU_L2PF")
	l2pfOProjMB = envInt("TILERT_GPU_L2PF_OPROJ_MB", 16)
)

// l2Prefetch is the ranges the first epilogue launch of layer lw prefetches
// (none unless l2pfMode is "1" and the weights are fp8 / bf16 as the
// serving path keeps them).
func (f *fwd) l2Prefetch(lw *dlayer) (r [kernels.MaxL2Prefetch]kernels.L2Range) {
	if l2pfMode != "1" {
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
