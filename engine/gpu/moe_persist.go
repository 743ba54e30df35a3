package gpu

import (
	"log/slog"
	"os"
	"sync"
	"sync/atomic"

	"github.com/cockroachdb/errors"

	"github.com/tilert-go/tilert/cuda"
	"github.com/tilert-go/tilert/cuda/kernels"
)

// moePersistOn (TILERT_GPU_MOE_PERSIST=1, opt-in; issues 10 and 11) runs
// the MoE half of a one-row decode layer as ONE persistent launch
// (kernels.MoEPersist, cuda/kernels/cu/persist/moe_persist.cu) instead of
// ~4-6: the post-attention norm, the router and the routing, the routed and
// shared experts' gate/up and down, the combine, the residual add and the
// next layer's input norm (or, with the deferred norm of normFuseOn, the
// residual add alone), with device-wide barriers between its phases and the
// shared expert's gate/up streaming while the router runs. In the
// tensor-parallel shard (shard.go, through moeThen) it takes the rank's
// normed row and writes the combine into ws.mo (its norms ride in the
// all-reduce). Every value is the default chain's bits (the kernel checks
// compare them), so tokens, caches and logits equal the default path's.
//
// Taken where: one row (a plain 1-slot decode step without MTP rows), fp8
// experts on the tile path with the shared expert among their slots (or
// none), the bf16 router on its wide GEMV (not TILERT_GPU_FUSE=2/3's
// router_route, whose sums differ), the sizes MoEPersistShapeOK takes
// (DeepSeek-V3.2, GLM-5, the tiny presets, the shard's 256-row experts).
// Everything else keeps its launches.
var moePersistOn = os.Getenv("TILERT_GPU_MOE_PERSIST") == "1"

var (
	moePersistLog, moePersistNoLog, moePersistLoadLog sync.Once
	// moePersistFailed: the persistent module did not load here (said
	// once); the chain runs.
	moePersistFailed atomic.Bool
)

// moePersistReady loads the persistent module (the runners call it before
// any graph capture when the switch is on) and says whether it runs here.
func (b *cudaDevice) moePersistReady() bool {
	err := b.k.MoEPersistLoad()
	if err != nil {
		moePersistFailed.Store(true)
		moePersistLoadLog.Do(func() {
			slog.Warn("TILERT_GPU_MOE_PERSIST=1: the persistent MoE kernel's module did not load; the chain of launches runs", "err", err)
		})
	}
	return err == nil
}

// moePersistFits says whether layer lw's MoE half runs as the persistent
// launch in this forward.
func (f *fwd) moePersistFits(lw *dlayer) bool {
	if !moePersistOn || f.M != 1 || !lw.MoE || moePersistFailed.Load() {
		return false
	}
	c := f.e.cfg
	H, E, K, MI := c.HiddenSize, c.NRoutedExperts, c.NumExpertsPerTok, c.MoEIntermediateSize
	why := ""
	switch {
	case !gemvTileOn:
		why = "TILERT_GPU_GEMV_TILE=0"
	case fuseRouter:
		why = "TILERT_GPU_FUSE=2/3 (router_route)"
	case f.groupedMoE():
		why = "grouped MoE"
	case lw.Router.kind != linBF16 || lw.Router.in != H || lw.Router.out != E || useGemm(lw.Router, 1):
		why = "router not a bf16 GEMV of the hidden row"
	case E > gemvBF16WideMaxN || !gemvWide(E):
		why = "router not on the wide GEMV"
	case lw.HasShared && !f.tileShared(lw):
		why = "shared expert not of the routed experts' shape"
	case kernels.MoEPersistShapeOK(E, K, H, MI) != nil:
		why = kernels.MoEPersistShapeOK(E, K, H, MI).Error()
	}
	if why != "" {
		moePersistNoLog.Do(func() {
			slog.Info("gpu: TILERT_GPU_MOE_PERSIST=1 not taken", "layer", lw.Idx, "why", why)
		})
		return false
	}
	moePersistLog.Do(func() {
		slog.Info("gpu: TILERT_GPU_MOE_PERSIST=1: the MoE half of one-row decode layers runs as one persistent launch",
			"hidden", H, "experts", E, "topk", K, "inter", MI)
	})
	return true
}

// moePersistArgs is the launch's arguments over the workspace for layer lw
// (the full form: norm in, residual and next norm out).
func (f *fwd) moePersistArgs(lw *dlayer) kernels.MoEPersistArgs {
	c := f.e.cfg
	ws := f.e.ws
	a := kernels.MoEPersistArgs{
		X: ws.x, B: ws.tmp, PostNorm: lw.PostNorm, H: ws.h, Eps: float32(c.RMSNormEps),
		Router: lw.Router.w, RLog: ws.rlog, Bias: lw.Bias, Idx: ws.eidx, Wts: ws.ewts,
		E: c.NRoutedExperts, K: c.NumExpertsPerTok, NGroup: c.NGroup, TopKGroup: c.TopKGroup, NormTopK: c.NormTopKProb,
		Scale: float32(c.RoutedScalingFactor),
		TGate: lw.expW[0], TGateS: lw.expS[0], TUp: lw.expW[1], TUpS: lw.expS[1], TDown: lw.expW[2], TDownS: lw.expS[2],
		EG: ws.eg, EY: ws.ey, Hidden: c.HiddenSize, Inter: c.MoEIntermediateSize, Ctl: ws.pctl,
	}
	if lw.HasShared {
		a.ShGate, a.ShGateS, a.ShUp, a.ShUpS = lw.ShGate.w, lw.ShGate.s, lw.ShUp.w, lw.ShUp.s
		a.ShDown, a.ShDownS = lw.ShDown.w, lw.ShDown.s
	}
	return a
}

// moePersistBlock is block's second half for a layer moePersistFits takes:
// x (+ o_proj's output in ws.tmp, unless postFuse added it already), the
// post-attention norm, the MoE, the residual add and the norm into nextY
// by nextW (or, deferred like moeTile's, left to the next layer).
func (f *fwd) moePersistBlock(lw *dlayer, nextY, nextW cuda.DevPtr, next *dlayer) {
	ws := f.e.ws
	a := f.moePersistArgs(lw)
	if f.oRes {
		a.B = 0 // o_proj added its output into ws.x (postFuse)
	}
	f.oRes, f.postNorm = false, 0
	dfr := f.deferNorm && next != nil && nextY == ws.h && f.l2PrefetchIn(next) == (l2Ranges{})
	if !dfr {
		a.Y, a.NextNorm = nextY, nextW
	}
	f.o.do(f.o.b.moePersist(a))
	if dfr {
		f.xNorm = nextW
	}
}

// moePersistCombine is moeThen's form of it (no closing norm asked: the
// shard's MoE): ws.h in, the combine into ws.mo.
func (f *fwd) moePersistCombine(lw *dlayer) {
	if f.postNorm != 0 {
		f.o.do(errors.New("gpu forward: a post-attention norm left to the router reached the persistent MoE's combine-only form"))
		return
	}
	ws := f.e.ws
	a := f.moePersistArgs(lw)
	a.X, a.B, a.PostNorm, a.H, a.Mo = ws.h, 0, 0, 0, ws.mo
	f.o.do(f.o.b.moePersist(a))
}

func (b *cudaDevice) moePersist(a kernels.MoEPersistArgs) error { return b.k.MoEPersist(b.s, a) }

// moePersist on the emulator is the chain of launches it replaces (the
// kernel's outputs are that chain's bits).
func (m *emuDevice) moePersist(a kernels.MoEPersistArgs) error { return moePersistChain(m, a) }

func (gb *graphDevice) moePersist(a kernels.MoEPersistArgs) error {
	bytes := int64(2*a.E*a.Hidden) + int64((a.K+1)*3*a.Inter*a.Hidden)
	_ = gb.rec("moePersist", bytes, func(b device) error { return b.moePersist(a) }, moePersistKey(a)...)
	return gb.shaped(a.Hidden, a.Inter, a.K)
}

func moePersistKey(a kernels.MoEPersistArgs) []uint64 {
	return []uint64{ku(a.X), ku(a.B), ku(a.PostNorm), ku(a.H), kf(a.Eps), ku(a.Router), ku(a.RLog), ku(a.Bias), ku(a.Idx),
		ku(a.Wts), ki(a.E), ki(a.K), ki(a.NGroup), ki(a.TopKGroup), kb(a.NormTopK), kf(a.Scale), ku(a.TGate), ku(a.TGateS),
		ku(a.TUp), ku(a.TUpS), ku(a.TDown), ku(a.TDownS), ku(a.ShGate), ku(a.ShGateS), ku(a.ShUp), ku(a.ShUpS),
		ku(a.ShDown), ku(a.ShDownS), ku(a.EG), ku(a.EY), ki(a.Hidden), ki(a.Inter), ku(a.Y), ku(a.NextNorm), ku(a.Ctl),
		ku(a.Mo)}
}

// moePersistChain runs a's MoE half as the default chain of launches on b
// (one row): what the persistent kernel's outputs equal bit for bit.
func moePersistChain(b device, a kernels.MoEPersistArgs) error {
	H, MI, E, K := a.Hidden, a.Inter, a.E, a.K
	hin := a.H
	switch {
	case a.Mo != 0:
		hin = a.X
	case a.B != 0:
		if err := b.addRMSNorm(a.H, a.X, a.B, a.PostNorm, 1, H, H, H, H, a.Eps); err != nil {
			return err
		}
	default:
		if err := b.rmsnorm(a.H, a.X, a.PostNorm, 1, H, H, H, a.Eps); err != nil {
			return err
		}
	}
	if err := b.gemvBF16(a.RLog, hin, a.Router, E, H, 1, H, E); err != nil {
		return err
	}
	if err := b.moeRoute(a.Idx, a.Wts, a.RLog, a.Bias, 1, E, K, a.NGroup, a.TopKGroup, a.NormTopK, a.Scale); err != nil {
		return err
	}
	var gw, gs, dw, ds [2]cuda.DevPtr
	dense := 0
	resid := cuda.DevPtr(0)
	if a.ShGate != 0 {
		dense = 1
		gw, gs = [2]cuda.DevPtr{a.ShGate, a.ShUp}, [2]cuda.DevPtr{a.ShGateS, a.ShUpS}
		dw, ds = [2]cuda.DevPtr{a.ShDown}, [2]cuda.DevPtr{a.ShDownS}
		resid = fptr(a.EY, K*H)
	}
	if err := b.experts(a.EG, hin, H, K, 0, [2]cuda.DevPtr{a.TGate, a.TUp}, [2]cuda.DevPtr{a.TGateS, a.TUpS}, a.Idx, K,
		gw, gs, dense, MI, H); err != nil {
		return err
	}
	if err := b.experts(a.EY, a.EG, MI, 1, K, [2]cuda.DevPtr{a.TDown}, [2]cuda.DevPtr{a.TDownS}, a.Idx, K, dw, ds, dense, H, MI); err != nil {
		return err
	}
	switch {
	case a.Mo != 0:
		return b.moeCombineSlots(a.Mo, a.EY, a.Wts, resid, 1, K, H)
	case a.Y != 0:
		return b.moeCombineNorm(a.Y, a.X, a.EY, a.Wts, resid, a.NextNorm, 1, K, H, H, H, a.Eps)
	}
	return b.moeCombineRes(a.X, a.EY, a.Wts, resid, 1, K, H)
}
