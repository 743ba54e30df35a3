package gpu

import (
	"os"

	"github.com/tilert-go/tilert/cuda"
	"github.com/tilert-go/tilert/cuda/kernels"
)

// normFuseOn (TILERT_GPU_NORM_FUSE=1, opt-in; issue 10) takes the layer
// input's RMSNorm off its own launch in the single-engine forward (not the
// tensor-parallel shard engine, whose forward keeps its launches):
//   - a MoE layer whose experts run as the tile launches (moeTile) with the
//     shared expert among them adds its combined output straight into the
//     residual ws.x (moeCombineRes) instead of writing ws.mo and running
//     the closing addRMSNorm into ws.h; the model input (embedding, or the
//     MTP layer's eh_proj) likewise skips its rmsnorm;
//   - the next layer's grouped input launch (projGroup: q_a, kv_a, indexer
//     wk and weights_proj) reads ws.x and normalises it in every block's
//     prologue, staged in shared memory with one round of loads
//     (kernels.GroupNorm.Staged: gemv_group_sn_*), bit for bit rmsnorm's
//     output; where that launch does not run (rows past
//     kernels.GroupNormRows, shapes or modes projGroup refuses) the norm
//     runs as rmsnorm(ws.h, ws.x) first (flushNorm).
//
// Every value is the default path's bits (the combine's sum and the
// residual add are add_rmsnorm's, the prologue's sums rmsnorm's), so tokens,
// caches and logits equal the default's; launches per 1-slot DeepSeek-V3.2
// step: 8 addRMSNorm (the MoE layers but the last) and the input rmsnorm
// fewer. The last layer keeps its closing add + final norm (the head and
// the MTP input read ws.hid), the dense layers their addRMSNorm, and (at
// =1) the post-attention addRMSNorm stays (its consumers, the router and
// the experts, read ws.h).
//
// TILERT_GPU_NORM_FUSE=2 also takes the post-attention addRMSNorm of a MoE
// layer off its launch (postFuse): o_proj adds its output into ws.x (the
// GEMV's resid argument, gemvFP8Res) and the router's launch normalises
// ws.x with the post-attention norm, writes the normed rows into ws.h for
// the experts and multiplies them by the router (routerNorm: one launch
// where the router runs the wide bf16 kernel, gemv_bf16_wide_norm_*;
// else rmsnorm then the router GEMV). The same bits again: -9 launches
// more a 1-slot step.
var (
	normFuseMode = os.Getenv("TILERT_GPU_NORM_FUSE")
	normFuseOn   = normFuseMode == "1" || normFuseMode == "2"
	normFusePost = normFuseMode == "2"
)

// postFuse says whether layer lw's post-attention norm rides in its router
// launch (normFusePost; the single-engine forward): fp8 o_proj and bf16
// router GEMVs (not the prefill GEMMs), the routing not fused with the
// router (TILERT_GPU_FUSE=2/3), the MoE not the grouped prefill path, at
// most 4 rows (the router's GEMV of more rows is the tile kernel, another
// summation order than routerNorm's wide one).
func (f *fwd) postFuse(lw *dlayer) bool {
	c := f.e.cfg
	H, M := c.HiddenSize, f.M
	return normFusePost && f.deferNorm && M <= 4 && lw.MoE && lw.O.kind == linFP8 && lw.O.out == H && !useGemm(lw.O, M) &&
		lw.Router.kind == linBF16 && lw.Router.in == H && lw.Router.out == c.NRoutedExperts && !useGemm(lw.Router, M) &&
		!fuseRouter && !f.groupedMoE()
}

// flushNorm runs a deferred input norm (f.xNorm) as its own launch: ws.h =
// rmsnorm(ws.x) with the deferred weights.
func (f *fwd) flushNorm() {
	if f.xNorm == 0 {
		return
	}
	c := f.e.cfg
	H := c.HiddenSize
	f.o.do(f.o.b.rmsnorm(f.e.ws.h, f.e.ws.x, f.xNorm, f.M, H, H, H, float32(c.RMSNormEps)))
	f.xNorm = 0
}

// linRes is o.lin of fp8 weights with resid added (y = W x + resid, resid
// rows ldy apart; y may be resid), per kernels.MaxTileM rows.
func (f *fwd) linRes(l dlin, y, x, resid cuda.DevPtr, M, ldx, ldy int) {
	o := f.o
	for r := 0; r < M && o.err == nil; r += kernels.MaxTileM {
		m := min(kernels.MaxTileM, M-r)
		o.do(o.b.gemvFP8Res(fptr(y, r*ldy), fptr(x, r*ldx), l.w, l.s, fptr(resid, r*ldy), l.out, l.in, m, ldx, ldy))
	}
}

// normTake is the deferred input norm handed to the grouped launch that
// consumes it (and the deferral cleared), or zero.
func (f *fwd) normTake() cuda.DevPtr {
	w := f.xNorm
	f.xNorm = 0
	return w
}
