package kernels

import (
	"fmt"

	"github.com/cockroachdb/errors"

	"github.com/tilert-go/tilert/cuda"
)

// Fused MoE router (cu/router.cu): the bf16 router GEMV of up to
// RouterRouteMaxM rows and the routing in one launch, bit for bit what
// GemvBF16Wide (over the rows 4 at a time) and then MoERoute write.

const (
	// RouterRouteMaxM is the most rows one RouterRoute launch takes.
	RouterRouteMaxM = 8
	// RouterRouteMaxE is the most experts: the last block routes with one
	// thread per expert.
	RouterRouteMaxE = 256
	// RouterRouteWorkspaceBytes is the device workspace a RouterRoute
	// launch needs (its block counter, a uint32): zeroed once when
	// allocated; every launch leaves it at zero.
	RouterRouteWorkspaceBytes = 4
)

// RouterRouteOK says whether RouterRoute takes the shape (and the wide
// GEMV's alignment) with x, w as given: M rows of ldx floats, E experts of
// H bf16 weights, K experts picked. Callers run GemvBF16Wide and MoERoute
// where it does not.
func RouterRouteOK(x, w cuda.DevPtr, M, E, H, K, ldx, ldy int) bool {
	return checkRouterRoute(M, E, H, K, ldx, ldy) == nil && gemvWideOK(x, H, ldx, 2) && uint64(w)%16 == 0
}

func checkRouterRoute(M, E, H, K, ldx, ldy int) error {
	if M <= 0 || M > RouterRouteMaxM || E <= 0 || E > RouterRouteMaxE || H <= 0 || K <= 0 || K > min(E, maxRouteTopK) {
		return errors.WithHintf(errors.Newf("router_route: M=%d E=%d H=%d K=%d (M 1..%d, E 1..%d, K 1..min(E, %d))",
			M, E, H, K, RouterRouteMaxM, RouterRouteMaxE, maxRouteTopK),
			"run GemvBF16Wide and MoERoute for this shape (kernels.RouterRouteOK says which shapes fit)")
	}
	if ldx < H || ldy < E {
		return errors.WithHintf(errors.Newf("router_route: ldx=%d < H=%d or ldy=%d < E=%d", ldx, H, ldy, E),
			"pass the row strides of x (at least H) and of the logits (at least E)")
	}
	return nil
}

// RouterRoute writes logits[m][e] = sum_h w[e][h]*x[m][h] (w bf16 [E][H],
// row stride ldy) for m < M as GemvBF16Wide does, then routes the M rows
// as MoERoute does (idx, wts [M][K]; bias [E] may be 0), in one launch.
// ws is RouterRouteWorkspaceBytes of device memory, zeroed before the
// first launch; launches sharing it must run one after another (one stream).
// The grid is GemvBF16Wide's (rows per block from gemvWideRows); the block
// finishing last routes. The kernel's 4-row form takes M <= 4, its 8-row
// form (more registers) the rest.
func (k *Set) RouterRoute(s cuda.Stream, logits, idx, wts, x, w, bias, ws cuda.DevPtr, M, E, H, K, ldx, ldy, ngroup, topkGroup int, norm bool, scale float32) error {
	if err := checkRouterRoute(M, E, H, K, ldx, ldy); err != nil {
		return err
	}
	if ngroup > maxRouteGroups || (ngroup > 1 && (E%ngroup != 0 || topkGroup <= 0)) {
		return errors.WithHintf(errors.Newf("router_route: E=%d ngroup=%d topk_group=%d (ngroup <= %d dividing E, topk_group >= 1)", E, ngroup, topkGroup, maxRouteGroups),
			"check the model config's n_group and topk_group")
	}
	if !gemvWideOK(x, H, ldx, 2) || uint64(w)%16 != 0 {
		return errors.WithHintf(errors.Newf("router_route: H=%d ldx=%d x %#x w %#x: needs H %% 8 == 0, ldx %% 4 == 0, 16-byte aligned x and w", H, ldx, uint64(x), uint64(w)),
			"check kernels.RouterRouteOK first and run GemvBF16Wide and MoERoute where it says no")
	}
	if ws == 0 {
		return errors.WithHint(errors.New("router_route: no workspace"),
			"allocate kernels.RouterRouteWorkspaceBytes of device memory, zeroed, and pass it as ws")
	}
	nv := 0
	if norm {
		nv = 1
	}
	r, mm := k.gemvWideRows(E, H, 2, 1), 4
	if M > 4 {
		mm = 8
	}
	return k.launch(fmt.Sprintf("moe_router_route_r%d_m%d", r, mm), cuda.D1(cdiv(E, r)), cuda.D1(256), 0, s,
		w, x, logits, bias, idx, wts, ws, E, H, M, ldx, ldy, K, ngroup, topkGroup, nv, scale)
}
