package kernels

import (
	"fmt"

	"github.com/tilert-go/tilert/cuda"
)

// The on-chip bf16 GEMV (cu/gemv_wide.cu, gemv_bf16_smem_r*): for a matrix
// that fits the SMs' shared memory with at most one block an SM (the MoE
// router, 256 x 7168 bf16: 2 rows, 28 KB a block), every block copies its
// rows into shared memory before its PDL wait, so after the wait only x is
// read (from L2). Issue 10: the router's wide GEMV took 6.3 us after the
// norm for 3.7 MB in the step's CUPTI timeline (session 21).

const (
	gemvSmemThreads = 256 // GSM_T
	// gemvSmemStatic bounds the kernels' static shared memory (the warp
	// partials, 8 x R x GEMV_MAXM floats, R <= 4: 512 bytes), kept out of
	// the dynamic budget.
	gemvSmemStatic = 1024
	// gemvSmemDefaultShared is what a block may use without raising its limit.
	gemvSmemDefaultShared = 48 << 10
)

// gemvSmemRows are the compiled rows-per-block variants.
var gemvSmemRows = []int{1, 2, 4}

// gemvSmemPlan is how gemv_bf16_smem runs N x K bf16 at M rows on sms SMs
// whose blocks may opt into maxShared bytes of shared memory: r rows a
// block (the fewest that keep the grid within one block an SM, so every
// block is resident and stages its rows before the wait) and smem bytes of
// dynamic shared memory (weights and x in 16-byte slots, each of the
// block's threads owning ceil(K/8/256) chunks of every row). ok is false
// when no variant fits: more than 4 rows an SM, rows and x past the shared
// memory, K not whole 16-byte chunks, or M outside 1..4.
func gemvSmemPlan(sms, maxShared, N, K, M int) (r, smem int, ok bool) {
	if sms <= 0 || N <= 0 || K <= 0 || K%8 != 0 || M <= 0 || M > maxGemvM {
		return 0, 0, false
	}
	trips := cdiv(K/8, gemvSmemThreads)
	for _, r := range gemvSmemRows {
		if cdiv(N, r) > sms {
			continue
		}
		smem = trips * (r + 2*M) * gemvSmemThreads * 16
		if smem > maxShared-gemvSmemStatic {
			return 0, 0, false
		}
		return r, smem, true
	}
	return 0, 0, false
}

// GemvBF16SmemOK says whether GemvBF16Smem runs the shape on its own
// kernel: an sm_80+ device (cp.async), a plan (gemvSmemPlan), whole 16-byte
// chunks of K, 16-byte aligned w and x and ldx % 4 == 0 (as the wide
// kernels need).
func (k *Set) GemvBF16SmemOK(x, w cuda.DevPtr, N, K, M, ldx int) bool {
	info := k.c.Info()
	if info.CCMajor < 8 || ldx < K || !gemvWideOK(x, K, ldx, 2) || uint64(w)%16 != 0 {
		return false
	}
	_, _, ok := gemvSmemPlan(info.SMs, info.MaxSharedOptin, N, K, M)
	return ok
}

// GemvBF16Smem is GemvBF16Wide (the same arguments and output, up to
// float32 summation order; run to run reproducible: fixed-order sums)
// through gemv_bf16_smem_r<R>; shapes GemvBF16SmemOK refuses run
// GemvBF16Wide. W must not be written by the kernel before it on the
// stream: launched programmatically, the kernel reads W before its wait.
func (k *Set) GemvBF16Smem(s cuda.Stream, y, x, w, resid cuda.DevPtr, N, K, M, ldx, ldy int) error {
	if err := checkGemv(N, K, M, ldx, ldy); err != nil {
		return err
	}
	if !k.GemvBF16SmemOK(x, w, N, K, M, ldx) {
		return k.GemvBF16Wide(s, y, x, w, resid, N, K, M, ldx, ldy)
	}
	info := k.c.Info()
	r, smem, _ := gemvSmemPlan(info.SMs, info.MaxSharedOptin, N, K, M)
	f, err := k.fn(fmt.Sprintf("gemv_bf16_smem_r%d", r))
	if err != nil {
		return err
	}
	if smem > gemvSmemDefaultShared {
		if _, ok := bigShared.Load(f); !ok {
			// Once per function, to the most any plan asks for.
			if err := k.c.SetMaxDynamicShared(f, info.MaxSharedOptin-gemvSmemStatic); err != nil {
				return err
			}
			bigShared.Store(f, true)
		}
	}
	return k.launchFn(f, cuda.D1(cdiv(N, r)), cuda.D1(gemvSmemThreads), smem, s, w, x, y, resid, N, K, M, ldx, ldy)
}
