package kernels

import (
	"sync/atomic"

	"github.com/cockroachdb/errors"

	"github.com/tilert-go/tilert/cuda"
)

// Launchers for cu/fused.cu: per-row epilogues that each replace a run of
// small launches with one, bit-identical to that run. RouterRoute and
// MoECombineAddRMSNorm (router_route, moe_combine_add_rmsnorm) were removed
// in session 15, slower on the H200; they last exist at commit ca3f1b5.

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
//
// Rows of several caches (slots) in one launch (attn_epilogue_rows):
// Bases != 0 is int64 per row on the device, the row's slot buffer; row
// r's MLA cache is then Bases[r]+MLAOff (the kv part on when MLARows) and
// its indexer pages Bases[r]+IdxOff (on when IdxRows), and MLACache and
// IdxCache stay 0. Every row's output is the one-cache launch's on that
// row's caches.
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

	Bases            cuda.DevPtr
	MLAOff, IdxOff   int64
	MLARows, IdxRows bool

	// QS, when on (one row, one cache, the query part): the query is
	// multiplied by QS's RMSNorm scale before its RoPE and quantisation
	// (attn_epilogue_qs; TILERT_GPU_QA_NORM=late, where wq_b ran on q_a
	// times its norm weight alone).
	QS QScale
}

// kvOn and idxOn say whether the latent rows' and the indexer keys' parts
// run (a cache given, directly or per row).
func (a *AttnEpilogue) kvOn() bool  { return a.MLACache != 0 || a.MLARows }
func (a *AttnEpilogue) idxOn() bool { return a.IdxCache != 0 || a.IdxRows }

// Check says what is wrong with a's shapes, or nil.
func (a *AttnEpilogue) Check() error {
	if a.Rows <= 0 || a.Rot <= 0 || a.Rot%8 != 0 || a.Rot > IndexerHeadDim {
		return errors.Newf("attn epilogue: rows=%d rot=%d (a multiple of 8 up to %d)", a.Rows, a.Rot, IndexerHeadDim)
	}
	if a.Bases == 0 && (a.MLARows || a.IdxRows || a.MLAOff != 0 || a.IdxOff != 0) {
		return errors.WithHint(errors.Newf("attn epilogue: per-row caches (MLARows=%v IdxRows=%v, offsets %d and %d) without row bases",
			a.MLARows, a.IdxRows, a.MLAOff, a.IdxOff), "set Bases (int64 per row), or give MLACache / IdxCache for one cache")
	}
	if a.Bases != 0 {
		if a.MLACache != 0 || a.IdxCache != 0 {
			return errors.WithHint(errors.Newf("attn epilogue: row bases with MLACache %#x / IdxCache %#x",
				uint64(a.MLACache), uint64(a.IdxCache)), "with Bases the caches are Bases[r]+MLAOff / +IdxOff (MLARows, IdxRows); leave MLACache and IdxCache 0")
		}
		if a.MLAOff < 0 || a.IdxOff < 0 || (!a.MLARows && a.MLAOff != 0) || (!a.IdxRows && a.IdxOff != 0) {
			return errors.Newf("attn epilogue: cache offsets %d (MLARows=%v) and %d (IdxRows=%v): non-negative, and only for a part that is on",
				a.MLAOff, a.MLARows, a.IdxOff, a.IdxRows)
		}
	}
	if a.kvOn() && (a.Rot != MLARopeDim || a.LdKV < MLALatentDim+MLARopeDim || a.LdKV%4 != 0 || a.KVNorm == 0) {
		return errors.Newf("attn epilogue: kv part needs rot %d (got %d), ld >= 576 and a multiple of 4 (got %d) and norm weights",
			MLARopeDim, a.Rot, a.LdKV)
	}
	if a.idxOn() && (a.LdIK < IndexerHeadDim || a.LdIK%4 != 0) {
		return errors.Newf("attn epilogue: indexer key ld=%d (>= 128, a multiple of 4)", a.LdIK)
	}
	if a.QH != 0 && (a.IH <= 0 || a.IH > IndexerQHeads || a.WQ == 0 || a.IQ == 0 || a.IW == 0) {
		return errors.Newf("attn epilogue: indexer query of %d heads (1..%d) needs IQ, IW and WQ", a.IH, IndexerQHeads)
	}
	if !a.kvOn() && !a.idxOn() && a.QH == 0 {
		return errors.New("attn epilogue: nothing to do (no MLA cache, indexer cache or query output)")
	}
	return nil
}

// AttnEpilogue launches attn_epilogue (attn_epilogue_rows with Bases).
func (k *Set) AttnEpilogue(s cuda.Stream, a AttnEpilogue) error {
	if err := a.Check(); err != nil {
		return err
	}
	gx := 1
	if a.QH != 0 {
		gx += IndexerQHeads / 16
	}
	if a.QS.On() {
		if a.QH == 0 || a.Rows != 1 || a.Bases != 0 || a.QS.N <= 0 || a.QS.K <= 0 {
			return errors.Newf("attn epilogue: RMSNorm's scale (sums %#x, N=%d, K=%d) needs the query part (QH) of one row (rows=%d) on one cache (bases %#x), N > 0 and K > 0",
				uint64(a.QS.SumSq), a.QS.N, a.QS.K, a.Rows, uint64(a.Bases))
		}
		if err := k.launch("attn_epilogue_qs", cuda.D3(gx, a.Rows, 1), cuda.D1(512), 0, s,
			a.KVA, a.LdKV, a.KVNorm, a.KVEps, a.MLACache, b2i(a.KVInterleaved),
			a.IK, a.LdIK, a.IKNormW, a.IKNormB, a.IKEps, a.IdxCache, b2i(a.IdxInterleaved),
			a.IQ, a.IW, a.QH, a.WQ, a.IH, a.WScale, a.Pos, a.Cos, a.Sin, a.Rot, a.QS.SumSq, a.QS.N, a.QS.K, a.QS.Eps); err != nil {
			return err
		}
		AttnEpilogueQSLaunches.Add(1)
		return nil
	}
	if a.Bases != 0 {
		return k.launch("attn_epilogue_rows", cuda.D3(gx, a.Rows, 1), cuda.D1(512), 0, s,
			a.KVA, a.LdKV, a.KVNorm, a.KVEps, a.MLAOff, b2i(a.MLARows), b2i(a.KVInterleaved),
			a.IK, a.LdIK, a.IKNormW, a.IKNormB, a.IKEps, a.IdxOff, b2i(a.IdxRows), b2i(a.IdxInterleaved),
			a.IQ, a.IW, a.QH, a.WQ, a.IH, a.WScale, a.Pos, a.Cos, a.Sin, a.Rot, a.Bases)
	}
	return k.launch("attn_epilogue", cuda.D3(gx, a.Rows, 1), cuda.D1(512), 0, s,
		a.KVA, a.LdKV, a.KVNorm, a.KVEps, a.MLACache, b2i(a.KVInterleaved),
		a.IK, a.LdIK, a.IKNormW, a.IKNormB, a.IKEps, a.IdxCache, b2i(a.IdxInterleaved),
		a.IQ, a.IW, a.QH, a.WQ, a.IH, a.WScale, a.Pos, a.Cos, a.Sin, a.Rot)
}

// AttnEpilogueQSLaunches counts attn_epilogue_qs launches (tests).
var AttnEpilogueQSLaunches atomic.Int64
