package gpu

import (
	"os"

	"github.com/cockroachdb/errors"

	"github.com/tilert-go/tilert/cuda/kernels"
)

// TILERT_GPU_QB_ABSORB: a one-row step's q_b and its query absorption as
// one launch (kernels.QBAbsorb, cu/absorb/qb_absorb.cu) in place of q_b's
// tile GEMV and absorb_q_fast; the outputs are the two launches' bit for
// bit. Why: session 56's H200 trace has the query's chain (q_b, then
// absorb_q's 512 blocks) end within 1 us of the indexer's, and absorb_q's
// blocks run beside the one-block top-k, which then takes 8.8 us after the
// scores against 6.2 alone. One launch drops a boundary and takes the
// absorb's blocks off the top-k's SMs.
//   - unset (auto, the default since session 60): one block a head where
//     the heads give 3/4 of the SMs a block (kernels.QBAbsorbAutoSMs:
//     DeepSeek-V3.2 dims' 128 heads, not GLM-5 dims' 64) and no row is
//     past kernels.TopKRadixOneMaxT keys. One H100 (session 60 calls A-B,
//     docs/measured/h100-2026-12-07-s60): DeepSeek-V3.2 dims -20 / -19 us
//     a step at 8192, +20 / +20 at 131072 (the long-row scores' blocks wait
//     for SM room beside its 128 long blocks); GLM-5 dims +56 / +57 at one
//     block a head, +3 / +3 at two;
//   - 1 / 2: one block a head / a cluster of two, wherever the kernel
//     takes the shape; 0: the two launches.
//
// TILERT_GPU_QB_ABSORB_PF=1: the blocks ask their W_UK slice into the L2
// while q_b streams (+20 us a step in session 60's call A against without).
var (
	qbAbsorbMode   = os.Getenv("TILERT_GPU_QB_ABSORB")
	qbAbsorbPFMode = os.Getenv("TILERT_GPU_QB_ABSORB_PF")
)

// qbAbsorbBlocks is the blocks a head TILERT_GPU_QB_ABSORB asks for this
// step (0 auto: kernels.QBAbsorbArgs.Blocks' rule) and whether it asks at
// all.
func (f *fwd) qbAbsorbBlocks() (int, bool) {
	switch qbAbsorbMode {
	case "1":
		return 1, true
	case "2":
		return 2, true
	case "":
		return 0, !f.long()
	}
	return 0, false
}

// qbAbsorb queues q_b of ws.qa and the query absorption as one launch
// where the switch asks for it and the device takes the shape, and says
// whether it did; the caller otherwise runs the two.
func (f *fwd) qbAbsorb(lw *dlayer) bool {
	blocks, on := f.qbAbsorbBlocks()
	l := lw.QB
	if !on || f.M != 1 || l.kind != linFP8 || l.s == 0 || !lw.uk.fp8 || useGemm(l, 1) {
		return false
	}
	e, o, ws := f.e, f.o, f.e.ws
	c := e.cfg
	nope, P, H := c.QKNopeHeadDim, c.QKRopeHeadDim, c.NumHeads
	hs := nope + P
	if l.out != H*hs {
		return false
	}
	a := kernels.QBAbsorbArgs{
		Q: ws.q, Out: ws.qlat, QPE: ws.qpe, X: ws.qa, WQ: l.w, SQ: l.s, W: lw.uk.w, S: lw.uk.s,
		H: H, Nope: nope, R: c.KVLoraRank, HS: hs, P: P, K: l.in,
		Rope:   f.qRope(),
		QS:     f.qaScale,
		Blocks: blocks, Prefetch: qbAbsorbPFMode == "1",
	}
	if !o.b.qbAbsorbOK(a) {
		return false
	}
	o.do(o.b.qbAbsorb(a))
	return true
}

// qbAbsorbOK: the path the two launches would take is the tile GEMV and
// absorb_q_fast (whose bits the kernel keeps), and the kernel takes a.
func (b *cudaDevice) qbAbsorbOK(a kernels.QBAbsorbArgs) bool {
	return gemvTileOn && !b.useMMA(a.X, a.WQ, a.H*a.HS, a.K, 1, a.K, 1) &&
		b.absorbFastQ(true, 1, a.Nope, a.R, a.HS, a.P, a.QPE != 0) && b.k.QBAbsorbOK(a)
}

func (b *cudaDevice) qbAbsorb(a kernels.QBAbsorbArgs) error { return b.k.QBAbsorb(b.s, a) }

// The emulator runs the two operations the launch replaces (the GPU's
// launch is their bits), so the CPU tests take the engine's path at any
// shape where the switch asks for 1 or 2; auto (Blocks 0, a rule on the
// device's SMs) it leaves to the two operations.
func (m *emuDevice) qbAbsorbOK(a kernels.QBAbsorbArgs) bool {
	return a.H > 0 && a.HS > 0 && a.K > 0 && (a.Blocks == 1 || a.Blocks == 2)
}

func (m *emuDevice) qbAbsorb(a kernels.QBAbsorbArgs) error {
	if !m.qbAbsorbOK(a) {
		return errors.Newf("emu qb absorb: H=%d HS=%d K=%d blocks %d", a.H, a.HS, a.K, a.Blocks)
	}
	N := a.H * a.HS
	if err := m.gemvFP8(a.Q, a.X, a.WQ, a.SQ, N, a.K, 1, a.K, N); err != nil {
		return err
	}
	return m.absorbQ(a.Out, a.QPE, a.Q, a.W, a.S, true, 1, a.H, a.Nope, a.R, N, a.HS, a.P, a.Rope, a.QS)
}

func (gb *graphDevice) qbAbsorb(a kernels.QBAbsorbArgs) error {
	return gb.rec("qbAbsorb", int64(a.H)*int64(a.HS*a.K+a.Nope*a.R), func(b device) error { return b.qbAbsorb(a) },
		ku(a.Q), ku(a.Out), ku(a.QPE), ku(a.X), ku(a.WQ), ku(a.SQ), ku(a.W), ku(a.S), ki(a.H), ki(a.Nope), ki(a.R),
		ki(a.HS), ki(a.P), ki(a.K), ku(a.Rope.Pos), ku(a.Rope.Cos), ku(a.Rope.Sin), kb(a.Rope.Interleaved),
		ku(a.QS.SumSq), ki(a.QS.N), ki(a.QS.K), kf(a.QS.Eps), ki(a.Blocks), kb(a.Prefetch))
}
