package kernels

import (
	"fmt"
	"sync/atomic"

	"github.com/cockroachdb/errors"

	"github.com/tilert-go/tilert/cuda"
)

// QBAbsorb (cu/absorb/qb_absorb.cu; TILERT_GPU_QB_ABSORB, session 60, issue
// 10): a one-row step's q_b GEMV and its query absorption in one launch, a
// head's rows summed and absorbed by its own blocks (cl of them, a cluster
// when 2). qo, out and qpe get what GemvFP8Tile(qo, x, wq, sq) and then
// AbsorbQFast (or AbsorbQFastScaled with qs) write, bit for bit, where
// QBAbsorbOK says the launch takes the shape.
type QBAbsorbArgs struct {
	Q, Out, QPE cuda.DevPtr // q_b's row [H*HS], the absorbed sums [H][R], the rotated RoPE part [H][P] (0: none)
	X           cuda.DevPtr // q_b's input row, K floats
	WQ, SQ      cuda.DevPtr // q_b: fp8 [H*HS][K] and its 128x128 block scales
	W, S        cuda.DevPtr // W_UK: fp8 [H][Nope][R] and its scales [H*Nope][R/128]
	H, Nope, R  int
	HS, P, K    int
	Rope        QRope
	QS          QScale
	// Blocks a head: 1, or 2 as a cluster (each block half the q_b rows
	// and half the absorbed columns); 0 (auto): 1 where the heads give at
	// least QBAbsorbAutoSMs of the device's SMs a block, else not taken.
	Blocks int
	// Prefetch: the blocks ask their W_UK slice into the L2 while q_b's
	// rows stream (measured slower, session 60: off by default).
	Prefetch bool
}

// QBAbsorbAutoSMs is the share of the SMs (in quarters) a head count must
// give a block for Blocks 0 to take one block a head: measured on one H100
// (session 60, docs/measured/h100-2026-12-07-s60), DeepSeek-V3.2 dims' 128
// heads on 132 SMs -20 / -19 us a step at 8192, GLM-5 dims' 64 heads +47
// at one block a head (one run) and +3 / +3 at two.
const QBAbsorbAutoSMs = 3

// blocks is a's blocks a head on sms SMs (0: none).
func (a QBAbsorbArgs) blocks(sms int) int {
	if a.Blocks == 0 {
		if 4*a.H >= QBAbsorbAutoSMs*sms {
			return 1
		}
		return 0
	}
	return a.Blocks
}

// QBAbsorbLaunches counts QBAbsorb launches (the engine checks ask that they
// ran).
var QBAbsorbLaunches atomic.Int64

// qbAbsorbKernel names the kernel for a's shape, or says why none takes it:
// q_b's one-row tile launch on groups of 32 with nope <= 128 or of 64 with
// nope <= 256 (the group size its sums follow), absorb_q_fast's g 8 (its
// columns a block on this device), and the shape limits of the kernel.
func (k *Set) qbAbsorbKernel(a QBAbsorbArgs) (string, int, error) {
	auto := a.Blocks == 0
	if a.Blocks = a.blocks(k.c.Info().SMs); a.Blocks == 0 && auto {
		return "", 0, errors.Newf("%d heads on %d SMs: fewer than %d/4 of the SMs get a block (Blocks 0)", a.H, k.c.Info().SMs, QBAbsorbAutoSMs)
	}
	name, err := k.qbAbsorbShape(a)
	return name, a.Blocks, err
}

// qbAbsorbShape is qbAbsorbKernel for a's blocks a head (1 or 2).
func (k *Set) qbAbsorbShape(a QBAbsorbArgs) (string, error) {
	N := a.H * a.HS
	switch {
	case a.H <= 0 || a.K <= 0 || a.K%16 != 0 || a.HS > 512 || a.Blocks < 1 || a.Blocks > 2:
		return "", errors.Newf("H=%d K=%d HS=%d blocks %d: needs H > 0, K a multiple of 16, HS <= 512, 1 or 2 blocks a head", a.H, a.K, a.HS, a.Blocks)
	case a.HS%(8*a.Blocks) != 0 || a.R%(128*a.Blocks) != 0:
		return "", errors.Newf("HS=%d R=%d: each of %d blocks a head needs whole 8-row q_b tiles and 128-column absorb blocks", a.HS, a.R, a.Blocks)
	case !AbsorbQFastOK(a.Nope, a.R, a.HS, a.P, a.QPE != 0):
		return "", errors.Newf("nope=%d R=%d HS=%d P=%d: absorb_q_fast does not take the shape", a.Nope, a.R, a.HS, a.P)
	case absorbCols(k.c.Info().SMs, a.H, a.R) != 8:
		return "", errors.Newf("%d heads x %d columns on %d SMs: absorb_q_fast runs another column split than the kernel's 128", a.H, a.R, k.c.Info().SMs)
	case !TileOK(a.X, a.K, a.K, 1) || uint64(a.WQ)%16 != 0 || a.SQ == 0:
		return "", errors.New("q_b's input or weights are not aligned for the tile GEMV, or it has no scales")
	}
	tl := tileLaunch{w0: a.WQ, s0: a.SQ, dense: 1, x: a.X, ldx: a.K, y: a.Q, ldy: N, N: N, K: a.K, M: 1}
	if p, ok := k.tilePlan(tl, false); ok && p.V == StageVariant {
		return "", errors.New("q_b is pinned to the staged GEMV (other sums)")
	}
	_, G, _ := k.tileKernel(tl)
	nr := 4
	if a.Nope > 128 {
		nr = 8
	}
	if !(G == 32 && nr == 4) && !(G == 64 && nr == 8) {
		return "", errors.Newf("q_b on groups of %d with %d nope rows: compiled for 32 with <= 128 and 64 with <= 256", G, a.Nope)
	}
	name := fmt.Sprintf("qb_absorb_g%d_r%d", G, nr)
	if a.Blocks == 2 {
		name += "_c2"
	}
	if a.QS.On() {
		name += "_n"
	}
	return name, nil
}

// QBAbsorbOK says whether QBAbsorb takes a here (an sm_90 device, the
// shapes qbAbsorbKernel lists).
func (k *Set) QBAbsorbOK(a QBAbsorbArgs) bool {
	if k.c.Info().CCMajor < 9 {
		return false
	}
	_, _, err := k.qbAbsorbKernel(a)
	return err == nil
}

// QBAbsorb launches qb_absorb over a's heads.
func (k *Set) QBAbsorb(s cuda.Stream, a QBAbsorbArgs) error {
	name, blocks, err := k.qbAbsorbKernel(a)
	if err != nil {
		return errors.Wrap(err, "qb absorb")
	}
	if a.QS.On() && (a.QS.N <= 0 || a.QS.K <= 0) {
		return errors.Newf("qb absorb: the norm's scale with N=%d K=%d: needs N > 0 and K > 0", a.QS.N, a.QS.K)
	}
	mod, err := k.absorbMod()
	if err != nil {
		return errors.Wrap(err, "qb absorb: the absorb module")
	}
	f, err := k.c.Function(mod, name)
	if err != nil {
		return err
	}
	args := []any{a.Q, a.Out, a.QPE, a.X, a.WQ, a.SQ, a.K, a.W, a.S, a.Nope, a.R, a.HS, a.P,
		a.Rope.Pos, a.Rope.Cos, a.Rope.Sin, b2i(a.Rope.Interleaved), a.QS.SumSq, a.QS.N, a.QS.K, a.QS.Eps, b2i(a.Prefetch)}
	if err := k.launchFn(f, cuda.D1(a.H*blocks), cuda.D1(256), 0, s, args...); err != nil {
		return err
	}
	QBAbsorbLaunches.Add(1)
	return nil
}
