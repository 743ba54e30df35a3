package kernels

import (
	"github.com/cockroachdb/errors"

	"github.com/tilert-go/tilert/cuda"
)

// The MoE router folded through o_proj (cu/router_fold.cu; engine/gpu
// NOTES.md "TILERT_GPU_ROUTER_FOLD=1"): W_r h = (A x + M v) / rms
// with A = W_r diag(w) and M = A W_o, so the router's two GEMVs need only
// the layer's input residual x and o_proj's input v, and the norm's block
// finishes the routing (AddRMSNormRoute). A and M are stored as hi/lo
// bf16 pairs, [2E][cols] (row j = bf16(v), row E + j = bf16(v - hi)): the
// bytes of float32 at ~2^-17 relative, for the wide bf16 GEMV; a GEMV of
// a pair matrix gives [2E] values whose halves AddRMSNormRoute sums.

// FoldKind is the element type of a matrix the fold reads.
type FoldKind int

const (
	FoldFP8  FoldKind = iota // e4m3 with float32 [cdiv(rows,128)][cdiv(cols,128)] block scales
	FoldBF16                 // bf16
	FoldF32                  // float32
)

// RouterFoldA writes A[j][i] = W_r[j][i] * w[i] into a ([E][H] float32,
// RouterFoldM's input) and as pairs into a2 ([2E][H] bf16), from the
// router's weights wr (bf16 or float32) and the post-attention norm's
// weights w.
func (k *Set) RouterFoldA(s cuda.Stream, a, a2, wr cuda.DevPtr, wrKind FoldKind, w cuda.DevPtr, E, H int) error {
	if E <= 0 || H <= 0 || (wrKind != FoldBF16 && wrKind != FoldF32) {
		return errors.Newf("router_fold_a: E=%d H=%d kind %d (the router is bf16 or float32)", E, H, wrKind)
	}
	return k.launch("router_fold_a", cuda.D3(cdiv(H, 256), E, 1), cuda.D1(256), 0, s, a, a2, wr, int(wrKind), w, E, H)
}

// RouterFoldM writes M = A W_o as pairs into m2 ([2E][K] bf16; each element
// a float64 sum rounded once to float32, then split) from A ([E][H]
// float32) and o_proj's weights wo ([H][K]; woS its block scales when fp8).
func (k *Set) RouterFoldM(s cuda.Stream, m2, a, wo, woS cuda.DevPtr, woKind FoldKind, E, H, K int) error {
	if E <= 0 || H <= 0 || K <= 0 || woKind < FoldFP8 || woKind > FoldF32 || (woKind == FoldFP8 && woS == 0) {
		return errors.Newf("router_fold_m: E=%d H=%d K=%d kind %d scales %#x", E, H, K, woKind, uint64(woS))
	}
	return k.launch("router_fold_m", cuda.D3(cdiv(K, 256), cdiv(E, 16), 1), cuda.D1(256), 0, s, m2, a, wo, woS, int(woKind), E, H, K)
}

// AddRMSNormRouteFits says whether AddRMSNormRoute takes rows of D values
// and E experts: add_rmsnorm_reg's block (its element map, so its bits)
// must have a thread per expert for the routing.
func AddRMSNormRouteFits(D, E int) bool {
	return normRegsFit(D) && E > 0 && E <= normThreads(D) && E <= maxRouteExperts
}

// AddRMSNormRoute is AddRMSNorm (x += b, y = rmsnorm(x) * w; the same bits
// as add_rmsnorm_reg) and then MoERoute's routing of each row on the logits
// (A x + M v) / rms in one launch: the router folded through o_proj. r1
// and r2 ([rows][2E]) are the pair matrices' products A2 x and M2 v of the
// row (x before the add).
func (k *Set) AddRMSNormRoute(s cuda.Stream, y, x, b, w cuda.DevPtr, rows, D int, eps float32,
	r1, r2, bias, idx, wts cuda.DevPtr, E, K, ngroup, topkGroup int, norm bool, scale float32) error {
	if rows <= 0 || !AddRMSNormRouteFits(D, E) {
		return errors.WithHint(errors.Newf("add_rmsnorm_route: rows=%d D=%d E=%d", rows, D, E),
			"the fused norm + routing needs a norm block of at least E threads (kernels.AddRMSNormRouteFits); run AddRMSNorm, the router GEMV and MoERoute instead")
	}
	if K <= 0 || K > min(E, maxRouteTopK) || ngroup > maxRouteGroups || (ngroup > 1 && (E%ngroup != 0 || topkGroup <= 0)) {
		return errors.Newf("add_rmsnorm_route: E=%d K=%d ngroup=%d topk_group=%d", E, K, ngroup, topkGroup)
	}
	nv := 0
	if norm {
		nv = 1
	}
	return k.launch("add_rmsnorm_route", cuda.D1(rows), cuda.D1(normThreads(D)), 0, s, x, b, w, y, D, D, D, D, eps,
		r1, r2, bias, idx, wts, E, K, ngroup, topkGroup, nv, scale)
}
