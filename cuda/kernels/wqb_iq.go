package kernels

import (
	"sync/atomic"

	"github.com/cockroachdb/errors"

	"github.com/tilert-go/tilert/cuda"
)

// WQBIdxQ is one row's wq_b GEMV and its attention epilogue in one launch
// (cu/wqb_iq.cu): Y = wq_b X on the tile plan the plain launch
// (GemvFP8Tile) would take, so Y's bits; block 0 does AttnEpilogue's
// latent-row and indexer-key parts, and each query head is prepared
// (AttnEpilogue's query part: RoPE, ue8m0 codes, head weight) by the block
// whose rows complete it, with the same expressions. Every output is the
// two launches' bit for bit.
type WQBIdxQ struct {
	W, S cuda.DevPtr // wq_b: fp8 [N][K] rows, their [N/128][K/128] block scales
	X    cuda.DevPtr // the normed q_a row, K float32
	Y    cuda.DevPtr // wq_b's output, N float32 (Epi.IQ)
	N, K int
	// Cnt: IndexerQHeads int32 counters, zeroed before the first launch;
	// every launch leaves them zeroed (graph replays need no reset).
	Cnt cuda.DevPtr
	// Epi: AttnEpilogue of one row on one cache each (no row bases), with
	// the query part on (QH) and IQ = Y.
	Epi AttnEpilogue
}

// wqbIdxQLaunches counts WQBIdxQ's fused launches (tests: the kernel ran).
var wqbIdxQLaunches atomic.Int64

// WQBIdxQLaunches is how many fused wq_b launches this process made.
func WQBIdxQLaunches() int64 { return wqbIdxQLaunches.Load() }

// wqbIdxQKernels are the fused kernels, by the plain launch's kernel name.
var wqbIdxQKernels = setOf(
	"gemv_tile_fp8_r8_m1", "gemv_tile_fp8_r8_m1_d16", "gemv_tile_fp8_r8_m1_o4",
	"gemv_tile_fp8_r4_m1", "gemv_tile_fp8_r4_m1_d16", "gemv_tile_fp8_r4_m1_o4",
	"gemv_tile_fp8_r2_m1", "gemv_tile_fp8_r2_m1_d16", "gemv_tile_fp8_r1_m1",
)

// Check says what is wrong with a's shapes, or nil.
func (a *WQBIdxQ) Check() error {
	e := &a.Epi
	if err := e.Check(); err != nil {
		return err
	}
	switch {
	case e.Rows != 1 || e.Bases != 0:
		return errors.WithHint(errors.Newf("wq_b + epilogue: %d rows (bases %#x): one row on one cache each", e.Rows, uint64(e.Bases)),
			"several rows or slots take GemvFP8Tile then AttnEpilogue")
	case e.QH == 0 || e.IQ != a.Y:
		return errors.Newf("wq_b + epilogue: the query part must be on (QH %#x) and read wq_b's output (IQ %#x, Y %#x)",
			uint64(e.QH), uint64(e.IQ), uint64(a.Y))
	case a.N != e.IH*IndexerHeadDim || a.K <= 0 || a.K%16 != 0:
		return errors.Newf("wq_b + epilogue: N=%d K=%d: N must be %d heads x %d, K a multiple of 16", a.N, a.K, e.IH, IndexerHeadDim)
	case a.W == 0 || uint64(a.W)%16 != 0 || a.S == 0 || !TileOK(a.X, a.K, a.K, 1) || a.Y == 0:
		return errors.Newf("wq_b + epilogue: weights %#x (16-byte aligned), scales %#x, x %#x (tile-aligned) and y %#x are needed",
			uint64(a.W), uint64(a.S), uint64(a.X), uint64(a.Y))
	case a.Cnt == 0:
		return errors.WithHint(errors.New("wq_b + epilogue: no head counters"),
			"give IndexerQHeads int32 of zeroed device memory (each launch leaves them zeroed)")
	}
	return nil
}

// WQBIdxQKernel is the fused kernel a launch of N x K wq_b rows would run
// (the plain launch's plan: shape rule, pins, grid cap) and its group size
// and tile blocks, or "" where that plan has no fused twin (a strided
// `_d16s` pin): the caller then runs the two launches.
func (k *Set) WQBIdxQKernel(N, K int, x, w cuda.DevPtr) (name string, G, gx int) {
	name, G, gx = k.tileKernel(tileLaunch{w0: w, dense: 1, x: x, ldx: K, ldy: N, N: N, K: K, M: 1})
	if !wqbIdxQKernels[name] {
		return "", 0, 0
	}
	return name + "_iq", G, gx
}

// WQBIdxQ launches the fused wq_b: gx tile blocks after block 0.
func (k *Set) WQBIdxQ(s cuda.Stream, a WQBIdxQ) error {
	if err := a.Check(); err != nil {
		return err
	}
	name, G, gx := k.WQBIdxQKernel(a.N, a.K, a.X, a.W)
	if name == "" {
		plain, _, _ := k.tileKernel(tileLaunch{w0: a.W, dense: 1, x: a.X, ldx: a.K, ldy: a.N, N: a.N, K: a.K, M: 1})
		return errors.WithHint(errors.Newf("wq_b + epilogue: the %dx%d launch's plan (%s) has no fused kernel", a.N, a.K, plain),
			"check WQBIdxQKernel first and run GemvFP8Tile then AttnEpilogue where it gives none")
	}
	e := a.Epi
	if err := k.launch(name, cuda.D1(gx+1), cuda.D1(tileThreads), 0, s,
		a.W, a.S, a.X, a.Y, a.N, a.K, G, b2i(TileRule >= 2),
		e.KVA, e.LdKV, e.KVNorm, e.KVEps, e.MLACache, b2i(e.KVInterleaved),
		e.IK, e.LdIK, e.IKNormW, e.IKNormB, e.IKEps, e.IdxCache, b2i(e.IdxInterleaved),
		e.IW, e.QH, e.WQ, e.IH, e.WScale, e.Pos, e.Cos, e.Sin, e.Rot, a.Cnt); err != nil {
		return err
	}
	wqbIdxQLaunches.Add(1)
	return nil
}
