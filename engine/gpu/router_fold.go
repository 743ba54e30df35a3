package gpu

import (
	"log/slog"
	"os"

	"github.com/tilert-go/tilert/cuda"
	"github.com/tilert-go/tilert/cuda/kernels"
	"github.com/tilert-go/tilert/engine"
)

// routerFoldOn: TILERT_GPU_ROUTER_FOLD=1 folds each MoE layer's router
// through o_proj (opt-in, NOT RUN on a GPU; engine/gpu NOTES.md
// "TILERT_GPU_ROUTER_FOLD=1"). The router is linear and the post-attention norm
// only scales, so W_r h = (A x + M v) / rms with A = W_r diag(w) and
// M = A W_o, computed at load (float64 sums, stored as hi/lo bf16 pairs):
// r1 = A x streams beside the sparse MLA, which leaves most SMs and the HBM
// idle, r2 = M v beside o_proj, and the post-attention norm's block routes
// on (r1 + r2) / rms (kernels.AddRMSNormRoute). The router GEMV and the
// routing launch leave the chain between o_proj and the routed experts
// (session 33's trace: 6.1 + 6.3 us after the norm's 3.4 a MoE layer).
// The logits move by float32 reassociation (~1e-7 relative, the pairs
// ~2^-17), the class of difference serving already has against the CPU
// engine; exact mode and a sharded engine's ranks keep the router GEMV.
var routerFoldOn = os.Getenv("TILERT_GPU_ROUTER_FOLD") == "1"

// foldRouters computes the folded router of every MoE layer at load, where
// routerFoldOn, serving mode and the fused norm + routing's block fit.
func (e *backend) foldRouters(b device, src Source) error {
	c := e.cfg
	if !routerFoldOn || e.opts.Mode == engine.ModeExact {
		return nil
	}
	if _, ok := src.(*shardSource); ok {
		return nil
	}
	E, H := c.NRoutedExperts, c.HiddenSize
	if !kernels.AddRMSNormRouteFits(H, E) {
		slog.Warn("TILERT_GPU_ROUTER_FOLD: the norm's block has fewer threads than experts; the router stays unfolded",
			"hidden", H, "experts", E)
		return nil
	}
	var scratch cuda.DevPtr
	defer func() {
		if scratch != 0 {
			_ = b.sync() // the folds that read it are done (on an error too)
			_ = b.free(scratch)
		}
	}()
	n, K := 0, 0
	for _, lw := range e.w.layers {
		if !lw.MoE {
			continue
		}
		wr, okR := foldKind(lw.Router.kind)
		wo, okO := foldKind(lw.O.kind)
		if !okR || wr == kernels.FoldFP8 || !okO || lw.Router.out != E || lw.Router.in != H || lw.O.out != H {
			continue
		}
		if scratch == 0 {
			var err error
			if scratch, err = b.alloc(int64(4 * E * H)); err != nil {
				return err
			}
		}
		K = lw.O.in
		a2, err := e.alloc(b, int64(2*2*E*H))
		if err != nil {
			return err
		}
		m2, err := e.alloc(b, int64(2*2*E*K))
		if err != nil {
			return err
		}
		if err := b.routerFold(scratch, a2, m2, lw.Router.w, wr, lw.PostNorm, lw.O.w, lw.O.s, wo, E, H, K); err != nil {
			return err
		}
		lw.foldA = dlin{kind: linBF16, w: a2, out: 2 * E, in: H}
		lw.foldM = dlin{kind: linBF16, w: m2, out: 2 * E, in: K}
		n++
	}
	if n > 0 {
		if err := b.sync(); err != nil {
			return err
		}
		slog.Info("TILERT_GPU_ROUTER_FOLD: the router folded through o_proj", "moe_layers", n,
			"bytes_a_layer", 4*E*(H+K))
	}
	return nil
}

func foldKind(k linKind) (kernels.FoldKind, bool) {
	switch k {
	case linFP8:
		return kernels.FoldFP8, true
	case linBF16:
		return kernels.FoldBF16, true
	case linF32:
		return kernels.FoldF32, true
	}
	return 0, false
}

// folded says whether this layer's router runs folded in this forward:
// where its GEMVs take float32 x (a decode step's rows). A prefill chunk's
// GEMMs may round x to one fp16 part (the fast prefill), and A x and M v
// each rounded lose what x + o cancels; prefill is compute-bound anyway,
// and keeps the router GEMV.
func (f *fwd) folded(lw *dlayer) bool {
	return lw.foldA.w != 0 && lw.foldM.w != 0 && !useGemm(lw.foldA, f.M) && !useGemm(lw.foldM, f.M)
}

// foldX runs r1 = A x of the layer's input residual (ws.x, untouched
// until the post-attention add) on the side stream beside the sparse MLA,
// or in line where the MoE side chain is off (TILERT_GPU_SIDE=0 or q).
func (f *fwd) foldX(lw *dlayer) {
	if !f.folded(lw) {
		return
	}
	ws, c := f.e.ws, f.e.cfg
	f.foldBeside(func() { f.o.lin(lw.foldA, ws.fr1, ws.x, f.M, c.HiddenSize, lw.foldA.out) })
}

// foldV runs r2 = M v of o_proj's input (ws.ao) beside o_proj, after
// joining r1 (one side chain at a time; r1 is done by then: it had the
// sparse MLA, its combine and absorb_v to run beside).
func (f *fwd) foldV(lw *dlayer) {
	if !f.folded(lw) {
		return
	}
	f.foldJoin()
	ws := f.e.ws
	f.foldBeside(func() { f.o.lin(lw.foldM, ws.fr2, ws.ao, f.M, lw.foldM.in, lw.foldM.out) })
}

// foldBeside runs gemv on the side stream with the shared expert's chain
// settings (its tile cap does not touch the wide bf16 GEMV; its priority),
// or in line where that chain is off.
func (f *fwd) foldBeside(gemv func()) {
	if !sideShOn {
		gemv()
		return
	}
	o := f.o
	o.do(o.b.fork(chainSh, f.M))
	gemv()
	o.do(o.b.unfork())
	f.foldSide = true
}

// foldJoin makes the main stream wait for a fold GEMV on the side stream.
func (f *fwd) foldJoin() {
	if f.foldSide {
		f.foldSide = false
		f.o.do(f.o.b.join())
	}
}

// normRoute joins r1 and r2 and runs the post-attention add + RMSNorm
// with the routing into ws.eidx / ws.ewts (moe then skips the router).
func (f *fwd) normRoute(lw *dlayer) {
	o, ws, c := f.o, f.e.ws, f.e.cfg
	f.foldJoin()
	o.do(o.b.addRMSNormRoute(ws.h, ws.x, ws.tmp, lw.PostNorm, f.M, c.HiddenSize, float32(c.RMSNormEps),
		ws.fr1, ws.fr2, lw.Bias, ws.eidx, ws.ewts, c.NRoutedExperts, c.NumExpertsPerTok, c.NGroup, c.TopKGroup,
		c.NormTopKProb, float32(c.RoutedScalingFactor)))
}
