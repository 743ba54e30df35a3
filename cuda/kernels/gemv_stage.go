package kernels

import (
	"sync/atomic"

	"github.com/cockroachdb/errors"

	"github.com/tilert-go/tilert/cuda"
)

// Staged one-row GEMV (cu/gemv_stage.cu, gemv_stage_fp8_r8_m1; the tile plan
// variant _st, e.g. TILERT_GPU_TILE_PLANS=8192x1536=G32/R8_st/B0): each block
// copies its whole share of the fp8 weights into shared memory before its
// PDL wait, so a programmatic launch streams them while the kernel before it
// runs; its sums are the tile kernels' G 32 / R 8 sums bit for bit.

// stageKernel is the staged GEMV's one kernel.
const stageKernel = "gemv_stage_fp8_r8_m1"

// StageVariant is the tile plan variant that pins a shape to the staged
// GEMV (G32/R8_st/B0 is its only plan).
const StageVariant = "_st"

// StageLaunches counts launches of the staged GEMV (tests).
var StageLaunches atomic.Int64

// stageSetup readies a staged launch before any graph capture (SetTilePlan
// runs it when a shape is pinned to _st): the staged kernel's dynamic shared
// memory limit. The kernels before it keep the driver's carveout: an SM
// changes its carveout only when idle, so the staged blocks become resident
// once the layer-input grouped GEMV leaves; asking the grouped GEMVs for 50,
// 60 or 100% shared memory let them in earlier but slowed the step (sessions
// 53-54; engine/gpu removed.go TILERT_GPU_STAGE_CARVEOUT).
func (k *Set) stageSetup() error {
	inf := k.c.Info()
	if inf.CCMajor < 8 {
		return nil // no staged launch here (stageLaunch falls back)
	}
	f, err := k.fn(stageKernel)
	if err != nil {
		return err
	}
	if _, set := bigShared.Load(f); !set {
		if err := k.c.SetMaxDynamicShared(f, inf.MaxSharedOptin); err != nil {
			return errors.Wrap(err, "the staged GEMV's shared memory")
		}
		bigShared.Store(f, true)
	}
	return nil
}

// stageSM is what an SM holds for the staged GEMV's blocks: sms of them,
// smemSM bytes of shared memory each, the driver keeping reserved bytes of
// it a block; maxSmem is a block's opt-in limit.
type stageSM struct{ sms, maxSmem, smemSM, reserved int }

// stageRows is the rows a block of the staged GEMV of N rows of K fp8
// weights owns (8 a warp: 64, 32, 16 or 8), and whether the shape fits it at
// all: rows a whole number of blocks, K a multiple of 512 (every lane the
// same chunks), the block's rows and scale row within maxSmem bytes of
// shared memory. It takes the most rows that still give about three
// quarters of the SMs a block (so the weights stream from most SMs) and
// that let two blocks share an SM: where only one fits (GLM-5 dims' q_b,
// 16384 x 2048: 128 KB blocks at 64 rows) a grid larger than the SMs runs in
// whole rounds of one block an SM (1.9 of them there, against 1.3 at 32 rows,
// three 64 KB blocks an SM).
func stageRows(N, K int, d stageSM) (rb int, ok bool) {
	if N <= 0 || K <= 0 || K%512 != 0 {
		return 0, false
	}
	smemSM := d.smemSM
	if smemSM <= 0 {
		smemSM = d.maxSmem + d.reserved
	}
	rb = 64
	for rb > 8 && N/rb < max(1, d.sms*3/4) {
		rb /= 2
	}
	if N%rb != 0 || stageSmem(rb, K) > d.maxSmem {
		return 0, false
	}
	for rb > 8 && 2*(stageSmem(rb, K)+d.reserved) > smemSM {
		rb /= 2
	}
	return rb, true
}

// stageSmem is the dynamic shared memory of a staged block of rb rows of K.
func stageSmem(rb, K int) int { return rb*K + 4*(K/128) }

// deviceStageRows is stageRows on this device (no shape fits below sm_80).
func (k *Set) deviceStageRows(N, K int) (int, bool) {
	inf := k.c.Info()
	if inf.CCMajor < 8 {
		return 0, false
	}
	return stageRows(N, K, stageSM{inf.SMs, inf.MaxSharedOptin, inf.MaxSharedPerSM, inf.ReservedShared})
}

// StageFits says whether a one-row fp8 GEMV of N rows of K can run staged on
// this device (sm_80+, the shape within stageRows' limits).
func (k *Set) StageFits(N, K int) bool {
	_, ok := k.deviceStageRows(N, K)
	return ok
}

// stageLaunch runs y = W x (+ resid) for one input row on the staged kernel
// when the shape and pointers allow it, and reports whether it did. Only a
// pinned shape gets here, so SetTilePlan's stageSetup has run.
func (k *Set) stageLaunch(s cuda.Stream, y, x, w, scale, resid cuda.DevPtr, N, K int) (bool, error) {
	rb, ok := k.deviceStageRows(N, K)
	if !ok || scale == 0 || uint64(w)%16 != 0 || uint64(x)%16 != 0 {
		return false, nil
	}
	if k.stageErr != nil {
		return false, k.stageErr
	}
	f, err := k.fn(stageKernel)
	if err != nil {
		return false, err
	}
	StageLaunches.Add(1)
	return true, k.launchFn(f, cuda.D1(N/rb), cuda.D1(rb*4), stageSmem(rb, K), s, w, scale, x, y, resid, K)
}
