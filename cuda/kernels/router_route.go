package kernels

import (
	"fmt"
	"sync/atomic"

	"github.com/cockroachdb/errors"

	"github.com/tilert-go/tilert/cuda"
)

// RouterRoute is one row's MoE router GEMV (bf16, E x K) with the routing
// in the same launch (cu/router_route.cu): Logits = W X on
// gemv_bf16_wide_r<R>'s plan (GemvBF16Wide's R, so the logits' bits); the
// block that counts last routes the row as moe_route_rank does (Idx, Wts:
// MoERoute's bits). Every output is GemvBF16Wide + MoERoute's.
type RouterRoute struct {
	W      cuda.DevPtr // bf16 [E][K] router weights, 16-byte aligned
	X      cuda.DevPtr // the input row, K float32, 16-byte aligned
	Logits cuda.DevPtr // the GEMV's output, E float32 (MoERoute's logits)
	E, K   int
	Bias   cuda.DevPtr // e_score_correction_bias [E], or 0
	Idx    cuda.DevPtr // int32 [TopK]: the chosen experts in selection order
	Wts    cuda.DevPtr // float32 [TopK]: their weights
	TopK   int
	NGroup int
	// TopKGroup, Norm and Scale are MoERoute's topkGroup, norm and scale.
	TopKGroup int
	Norm      bool
	Scale     float32
	// Cnt: one int32, zeroed before the first launch; every launch leaves
	// it zeroed (graph replays need no reset).
	Cnt cuda.DevPtr
}

// routerRouteMaxE is the fused kernel's block (gemv_wide.cu's 256
// threads): moe_route_rank_row needs a thread an expert.
const routerRouteMaxE = 256

// routerRouteLaunches counts RouterRoute's fused launches (tests).
var routerRouteLaunches atomic.Int64

// RouterRouteLaunches is how many fused router launches this process made.
func RouterRouteLaunches() int64 { return routerRouteLaunches.Load() }

// Check says what is wrong with a's shapes, or nil.
func (a *RouterRoute) Check() error {
	switch {
	case a.E <= 0 || a.E > routerRouteMaxE || a.K <= 0 || a.K%8 != 0:
		return errors.WithHint(errors.Newf("router + routing: E=%d K=%d: E must be 1..%d and K a positive multiple of 8",
			a.E, a.K, routerRouteMaxE), "run GemvBF16Wide then MoERoute")
	case a.TopK <= 0 || a.TopK > min(a.E, maxRouteTopK) || a.NGroup > maxRouteGroups:
		return errors.Newf("router + routing: top-k %d of %d experts, %d groups (top-k <= %d, groups <= %d)",
			a.TopK, a.E, a.NGroup, maxRouteTopK, maxRouteGroups)
	case a.NGroup > 1 && (a.E%a.NGroup != 0 || a.TopKGroup <= 0):
		return errors.Newf("router + routing: %d experts not divisible into %d groups, or topk_group %d",
			a.E, a.NGroup, a.TopKGroup)
	case a.W == 0 || uint64(a.W)%16 != 0 || a.X == 0 || !gemvWideOK(a.X, a.K, a.K, 2) || a.Logits == 0:
		return errors.Newf("router + routing: weights %#x and x %#x (16-byte aligned) and logits %#x are needed",
			uint64(a.W), uint64(a.X), uint64(a.Logits))
	case a.Idx == 0 || a.Wts == 0:
		return errors.Newf("router + routing: expert ids %#x and weights %#x are needed", uint64(a.Idx), uint64(a.Wts))
	case a.Cnt == 0:
		return errors.WithHint(errors.New("router + routing: no block counter"),
			"give one int32 of zeroed device memory (each launch leaves it zeroed)")
	}
	return nil
}

// RouterRouteKernel is the fused kernel and grid an E x K launch runs:
// GemvBF16Wide's rows a block for one row.
func (k *Set) RouterRouteKernel(E, K int) (name string, grid int) {
	r := k.gemvWideRows(E, K, 2, 1)
	return fmt.Sprintf("gemv_bf16_wide_r%d_rt", r), cdiv(E, r)
}

// RouterRoute launches the fused router GEMV + routing.
func (k *Set) RouterRoute(s cuda.Stream, a RouterRoute) error {
	if err := a.Check(); err != nil {
		return err
	}
	name, grid := k.RouterRouteKernel(a.E, a.K)
	if err := k.launch(name, cuda.D1(grid), cuda.D1(routerRouteMaxE), 0, s, a.W, a.X, a.Logits, a.E, a.K, a.Bias,
		a.Idx, a.Wts, a.TopK, a.NGroup, a.TopKGroup, b2i(a.Norm), a.Scale, a.Cnt); err != nil {
		return err
	}
	routerRouteLaunches.Add(1)
	return nil
}
