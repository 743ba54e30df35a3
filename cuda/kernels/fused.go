package kernels

import (
	"github.com/cockroachdb/errors"

	"github.com/tilert-go/tilert/cuda"
)

// Launchers for cu/fused.cu: per-row epilogues that each replace a run of
// small launches with one, bit-identical to that run.

// AttnEpilogue is the attention side's per-row work once the projections
// exist, for Rows rows at positions Pos[m] (int32 on the device; a negative
// position writes nothing). Each part runs when its output is set:
//   - MLACache != 0: RMSNorm (KVNorm, KVEps) of the 512 latent values of
//     KVA [Rows][LdKV], RoPE of its 64 rope values, the row written back and
//     stored as an fp8_ds_mla entry (RMSNorm, RoPE, EngMLACacheWrite);
//   - IdxCache != 0: LayerNorm (IKNormW, IKNormB, IKEps) of the 128-value
//     indexer keys IK [Rows][LdIK], RoPE of their first Rot values, written
//     back and stored in the fp8 indexer pages (LayerNorm, RoPE,
//     EngIndexerCacheWrite);
//   - QH != 0: IndexerQPrep(QH, WQ, IQ, IW, Pos, Cos, Sin, Rows, IH, Rot,
//     IdxInterleaved, WScale).
type AttnEpilogue struct {
	KVA            cuda.DevPtr
	LdKV           int
	KVNorm         cuda.DevPtr
	KVEps          float32
	MLACache       cuda.DevPtr
	KVInterleaved  bool
	IK             cuda.DevPtr
	LdIK           int
	IKNormW        cuda.DevPtr
	IKNormB        cuda.DevPtr
	IKEps          float32
	IdxCache       cuda.DevPtr
	IdxInterleaved bool
	IQ, IW, QH, WQ cuda.DevPtr
	IH             int
	WScale         float32
	Pos, Cos, Sin  cuda.DevPtr
	Rot, Rows      int
}

// Check says what is wrong with a's shapes, or nil.
func (a *AttnEpilogue) Check() error {
	if a.Rows <= 0 || a.Rot <= 0 || a.Rot%8 != 0 || a.Rot > IndexerHeadDim {
		return errors.Newf("attn epilogue: rows=%d rot=%d (a multiple of 8 up to %d)", a.Rows, a.Rot, IndexerHeadDim)
	}
	if a.MLACache != 0 && (a.Rot != MLARopeDim || a.LdKV < MLALatentDim+MLARopeDim || a.LdKV%4 != 0 || a.KVNorm == 0) {
		return errors.Newf("attn epilogue: kv part needs rot %d (got %d), ld >= 576 and a multiple of 4 (got %d) and norm weights",
			MLARopeDim, a.Rot, a.LdKV)
	}
	if a.IdxCache != 0 && (a.LdIK < IndexerHeadDim || a.LdIK%4 != 0) {
		return errors.Newf("attn epilogue: indexer key ld=%d (>= 128, a multiple of 4)", a.LdIK)
	}
	if a.QH != 0 && (a.IH <= 0 || a.IH > IndexerQHeads || a.WQ == 0 || a.IQ == 0 || a.IW == 0) {
		return errors.Newf("attn epilogue: indexer query of %d heads (1..%d) needs IQ, IW and WQ", a.IH, IndexerQHeads)
	}
	if a.MLACache == 0 && a.IdxCache == 0 && a.QH == 0 {
		return errors.New("attn epilogue: nothing to do (no MLA cache, indexer cache or query output)")
	}
	return nil
}

// AttnEpilogue launches attn_epilogue.
func (k *Set) AttnEpilogue(s cuda.Stream, a AttnEpilogue) error {
	if err := a.Check(); err != nil {
		return err
	}
	gx := 1
	if a.QH != 0 {
		gx += IndexerQHeads / 16
	}
	return k.launch("attn_epilogue", cuda.D3(gx, a.Rows, 1), cuda.D1(512), 0, s,
		a.KVA, a.LdKV, a.KVNorm, a.KVEps, a.MLACache, b2i(a.KVInterleaved),
		a.IK, a.LdIK, a.IKNormW, a.IKNormB, a.IKEps, a.IdxCache, b2i(a.IdxInterleaved),
		a.IQ, a.IW, a.QH, a.WQ, a.IH, a.WScale, a.Pos, a.Cos, a.Sin, a.Rot)
}

// RouterRouteMaxRows and RouterRouteMaxExperts bound RouterRoute's shapes.
const (
	RouterRouteMaxRows    = 8
	RouterRouteMaxExperts = 256
)

// RouterRouteOK says whether RouterRoute takes the shape: at most 8 rows
// and 256 experts, whole 16-byte chunks of bf16 in K, float4-aligned rows
// of x and 16-byte aligned x and w, and what MoERoute takes.
func RouterRouteOK(x, w cuda.DevPtr, E, K, M, ldx, topk, ngroup, topkGroup int) bool {
	return M > 0 && M <= RouterRouteMaxRows && E > 0 && E <= RouterRouteMaxExperts && K > 0 && K%8 == 0 &&
		ldx >= K && ldx%4 == 0 && uint64(x)%16 == 0 && uint64(w)%16 == 0 &&
		topk > 0 && topk <= min(E, maxRouteTopK) && ngroup <= maxRouteGroups &&
		(ngroup <= 1 || (E%ngroup == 0 && topkGroup > 0))
}

// RouterRoute is GemvBF16Wide(logits, x, w, E, K, M, ldx, E) then
// MoERoute(idx, wts, logits, bias, M, E, topk, ...) in one launch, with the
// same results bit for bit (the last block routes). counter is a zeroed
// uint32 on the device that the launch leaves zeroed; launches sharing it
// must not run concurrently.
func (k *Set) RouterRoute(s cuda.Stream, idx, wts, logits, x, w, bias, counter cuda.DevPtr, E, K, M, ldx, topk, ngroup, topkGroup int, norm bool, scale float32) error {
	if !RouterRouteOK(x, w, E, K, M, ldx, topk, ngroup, topkGroup) || counter == 0 {
		return errors.Newf("router route: E=%d K=%d M=%d ldx=%d topk=%d ngroup=%d topk_group=%d (M <= %d, E <= %d, K %% 8 == 0, aligned x and w, a counter)",
			E, K, M, ldx, topk, ngroup, topkGroup, RouterRouteMaxRows, RouterRouteMaxExperts)
	}
	return k.launch("router_route", cuda.D1(E), cuda.D1(256), 0, s, w, x, logits, E, K, M, ldx, bias, idx, wts, topk, ngroup,
		topkGroup, b2i(norm), scale, counter, b2i(smallFast))
}

// MoECombineAddRMSNorm is MoECombineSlots(tmp, y, w, resid, M, k, D) then
// AddRMSNorm(out, x, tmp, nw, M, D, ldx, D, ldy, eps) in one launch, the same
// bits (tmp not stored): one block per row.
func (k *Set) MoECombineAddRMSNorm(s cuda.Stream, out, x, y, w, resid, nw cuda.DevPtr, M, kslots, D, ldx, ldy int, eps float32) error {
	if M <= 0 || kslots <= 0 || D <= 0 || ldx < D || ldy < D {
		return errors.Newf("moe combine add rmsnorm: M=%d k=%d D=%d ldx=%d ldy=%d", M, kslots, D, ldx, ldy)
	}
	return k.launch("moe_combine_add_rmsnorm", cuda.D1(M), cuda.D1(normThreads(D)), 0, s, y, w, resid, x, nw, out, kslots, D, ldx, ldy, eps)
}
