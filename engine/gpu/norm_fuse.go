package gpu

import (
	"os"

	"github.com/tilert-go/tilert/cuda"
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
// the MTP input read ws.hid), the dense layers their addRMSNorm, and the
// post-attention addRMSNorm stays (its consumers, the router and the
// experts, read ws.h).
var normFuseOn = os.Getenv("TILERT_GPU_NORM_FUSE") == "1"

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

// normTake is the deferred input norm handed to the grouped launch that
// consumes it (and the deferral cleared), or zero.
func (f *fwd) normTake() cuda.DevPtr {
	w := f.xNorm
	f.xNorm = 0
	return w
}
