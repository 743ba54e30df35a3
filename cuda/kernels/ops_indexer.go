package kernels

import (
	"os"
	"sync/atomic"

	"github.com/cockroachdb/errors"

	"github.com/tilert-go/tilert/cuda"
)

// The tensor-core indexer (cu/indexer_mma.cu): IndexerQPrep turns a row's
// indexer query into fp8 codes in mma fragment order plus per-head weights,
// IndexerScoresMMA scores the fp8 pages with them.
const (
	// IndexerQRowBytes is one row of IndexerQPrep's query codes.
	IndexerQRowBytes = 8192
	// IndexerQHeads is the heads a row holds (IndexerQPrep pads with
	// zeros); more indexer heads need the float kernels.
	IndexerQHeads = 64
)

// IndexerQByte is the byte of a row of IndexerQPrep's output that holds head
// h, dimension d (cu/indexer_mma.cu explains the order).
func IndexerQByte(h, d int) int {
	mt, r := h>>4, h&15
	g, hi := r&7, r>>3
	dd := d & 63
	ks := (d>>6)<<2 + (dd&15)>>2
	c, off := dd>>4, d&3
	j := 2*hi + off
	if off >= 2 {
		j = 4 + 2*hi + off - 2
	}
	return ((mt*8+ks)*32+g*4+c)*8 + j
}

// IndexerQPrep applies RoPE (RoPE's arithmetic; pairs as there) to
// dimensions [0, rot) of q ([M][H][128] float32, left unchanged), quantises
// each head to fp8 with a power-of-two scale (EngQuantUE8M0's rounding) and
// writes the codes to qh ([M][IndexerQRowBytes], IndexerQByte order) and
// wq[m][h] = w[m][h] * wscale * scale[m][h] ([M][IndexerQHeads], zero for
// h >= H).
func (k *Set) IndexerQPrep(s cuda.Stream, qh, wq, q, w, pos, cos, sin cuda.DevPtr, M, H, rot int, interleaved bool, wscale float32) error {
	if M <= 0 || H <= 0 || H > IndexerQHeads || rot < 0 || rot > IndexerHeadDim || rot%8 != 0 {
		return errors.Newf("indexer q prep: M=%d H=%d (at most %d) rot=%d (a multiple of 8 up to %d)", M, H, IndexerQHeads, rot, IndexerHeadDim)
	}
	il := 0
	if interleaved {
		il = 1
	}
	return k.launch("idx_q_prep", cuda.D3(IndexerQHeads/16, M, 1), cuda.D1(512), 0, s, q, w, pos, cos, sin, qh, wq, H, rot, il, wscale)
}

// IndexerMMASupported says whether the device runs IndexerScoresMMA (f16
// mma.sync with the hardware fp8 conversion: sm_89 and later).
func (k *Set) IndexerMMASupported() bool {
	i := k.c.Info()
	return i.CCMajor*10+i.CCMinor >= 89
}

// indexerMMABlocks is the blocks per row of IndexerScoresMMA: at most
// perSM blocks of 8 warps per SM over all rows (one wave), each warp taking
// whole 16-key groups.
func indexerMMABlocks(sms, perSM, nq, T int) int {
	groups := cdiv(T, 16)
	gpw := max(1, cdiv(groups*nq, perSM*max(1, sms)*8))
	return max(1, cdiv(groups, 8*gpw))
}

// IndexerScoresMMA is IndexerScores over the fp8 pages (same output, float32
// sums in another order) with the query from IndexerQPrep: qh
// [nq][IndexerQRowBytes], wq [nq][IndexerQHeads] (H^-0.5 and qkScale folded
// in there). hist != 0 (TopKRadixHist of a TopKRadix scratch for nq rows):
// also build TopKRadix's histogram of the scores, for TopKRadixAfterHist.
func (k *Set) IndexerScoresMMA(s cuda.Stream, out, qh, wq, cache, blockTable, lens, hist cuda.DevPtr, nq, T, ldOut int) error {
	if IdxCP > 0 {
		return k.indexerScoresMMACP(s, out, qh, wq, cache, blockTable, lens, hist, nq, T, ldOut, IdxCP == 2 && T > TopKRadixOneMaxT)
	}
	return k.indexerScoresMMA(s, out, qh, wq, cache, blockTable, lens, hist, nq, T, ldOut, true)
}

// IdxCP (TILERT_GPU_IDX_CP, opt-in, NOT RUN on a GPU yet) picks the
// indexer scores kernels that stage each warp's key groups in shared memory
// by cp.async (IDXM_RING groups in flight from the start, against one for
// _pf), with the same products and bits:
//   - "1": IndexerScoresMMA on indexer_scores_mma_cp (IndexerScoresMMARows on
//     indexer_scores_mma_rows_cp);
//   - "2": the same, and rows over TopKRadixOneMaxT keys on _cp2, two
//     groups a warp at a time, each query fragment loaded from shared memory
//     feeding four MMAs instead of two (one block an SM).
//
// For 131072 keys, where a warp takes ~4 groups and the scores (11.5 us
// alone for 17 MB: 35% of the copy rate) wait on memory once a group
// (session 24's ncu: latency bound, 0.55 eligible warps a scheduler); their
// fragment loads from shared memory then bound _cp (~4.5 us), which _cp2
// halves. ParseIdxCP checks the value (the engine refuses a bad one).
var IdxCP, idxCPErr = ParseIdxCP(os.Getenv("TILERT_GPU_IDX_CP"))

// IdxCPErr is the error of a bad TILERT_GPU_IDX_CP, nil when it is good.
func IdxCPErr() error { return idxCPErr }

// ParseIdxCP reads TILERT_GPU_IDX_CP: "" or "0" (off, 0), "1" or "2".
func ParseIdxCP(v string) (int, error) {
	switch v {
	case "", "0":
		return 0, nil
	case "1":
		return 1, nil
	case "2":
		return 2, nil
	}
	return 0, errors.WithHint(errors.Newf("TILERT_GPU_IDX_CP=%q: no such indexer scores kernel", v),
		"set it to 1 (key groups staged in shared memory), 2 (also two groups a warp on rows over 32768 keys) or leave it unset")
}

// IdxCPLaunches counts the _cp and _cp2 scores launches (tests).
var IdxCPLaunches atomic.Int64

// indexerCPSmemBytes is indexer_scores_mma_cp's dynamic shared memory: 8
// warps x IDXM_RING groups x IDXM_GROUP_BYTES (16 keys' codes and scales).
const indexerCPSmemBytes = 8 * 4 * (16*IndexerHeadDim + 16*4)

// indexerCP2SmemBytes is _cp2's: 8 warps x IDXM_RING2 pairs of groups.
const indexerCP2SmemBytes = 8 * 4 * 2 * (16*IndexerHeadDim + 16*4)

// indexerPairBlocks is _cp2's grid width: one block an SM, each warp
// taking as many group pairs as spreads nq rows of T keys over them, the
// fewest that keeps the nq rows' blocks within one wave (the rounding up
// of a row's blocks can otherwise put a few in a second).
func indexerPairBlocks(sms, nq, T int) int {
	pairs := cdiv(cdiv(T, 16), 2)
	wave := max(sms, nq)
	ppw := max(1, cdiv(pairs*nq, wave*8))
	for cdiv(pairs, 8*ppw)*nq > wave {
		ppw++
	}
	return max(1, cdiv(pairs, 8*ppw))
}

// indexerScoresMMACP is indexerScoresMMA on indexer_scores_mma_cp (IdxCP),
// with _pf's grid, or on _cp2 (pair) with indexerPairBlocks'.
func (k *Set) indexerScoresMMACP(s cuda.Stream, out, qh, wq, cache, blockTable, lens, hist cuda.DevPtr, nq, T, ldOut int, pair bool) error {
	if nq <= 0 || T <= 0 || ldOut < T {
		return errors.Newf("indexer mma cp: nq=%d T=%d ldOut=%d", nq, T, ldOut)
	}
	if !k.IndexerMMASupported() {
		i := k.c.Info()
		return errors.WithHint(errors.Newf("indexer mma cp: device %s is below sm_89", i.Arch()), "leave TILERT_GPU_IDX_CP unset")
	}
	return k.launchStaged("indexer_scores_mma", pair, nq, T, s, qh, wq, cache, blockTable, lens, out, T, ldOut, hist)
}

// launchStaged launches base's staged twin (IdxCP): base_cp on _pf's grid,
// or base_cp2 (pair) on indexerPairBlocks', with its dynamic shared memory
// allowed once; counted in IdxCPLaunches.
func (k *Set) launchStaged(base string, pair bool, nq, T int, s cuda.Stream, args ...any) error {
	name, smem, nbx := base+"_cp", indexerCPSmemBytes, indexerMMABlocks(k.c.Info().SMs, 2, nq, T)
	if pair {
		name, smem, nbx = base+"_cp2", indexerCP2SmemBytes, indexerPairBlocks(k.c.Info().SMs, nq, T)
	}
	f, err := k.fn(name)
	if err != nil {
		return err
	}
	if _, ok := bigShared.Load(f); !ok {
		if err := k.c.SetMaxDynamicShared(f, smem); err != nil {
			return errors.WithHint(err, "leave TILERT_GPU_IDX_CP unset")
		}
		bigShared.Store(f, true)
	}
	IdxCPLaunches.Add(1)
	return k.launchFn(f, cuda.D3(nbx, nq, 1), cuda.D1(256), smem, s, args...)
}

// IndexerScoresMMARows is IndexerScoresMMA over rows of different caches
// (slots) in one launch: row r's pages start at rowBase[r] + cacheOff
// (rowBase: nq int64 in device memory; cacheOff the layer's offset in
// every slot's region). The same scores as one launch per cache.
func (k *Set) IndexerScoresMMARows(s cuda.Stream, out, qh, wq cuda.DevPtr, cacheOff int64, rowBase, lens, hist cuda.DevPtr, nq, T, ldOut int) error {
	return k.indexerScoresMMARows(s, out, qh, wq, cacheOff, rowBase, lens, hist, nq, T, ldOut, IdxCP > 0, IdxCP == 2 && T > TopKRadixOneMaxT)
}

// indexerScoresMMARows runs indexer_scores_mma_rows, or its _cp twin (cp:
// the key groups staged as IdxCP's kernel does), or _cp2 (pair: two groups
// a warp at a time).
func (k *Set) indexerScoresMMARows(s cuda.Stream, out, qh, wq cuda.DevPtr, cacheOff int64, rowBase, lens, hist cuda.DevPtr, nq, T, ldOut int, cp, pair bool) error {
	if rowBase == 0 {
		return errors.New("indexer mma rows: no row bases")
	}
	if nq <= 0 || T <= 0 || ldOut < T {
		return errors.Newf("indexer mma rows: nq=%d T=%d ldOut=%d", nq, T, ldOut)
	}
	if !k.IndexerMMASupported() {
		i := k.c.Info()
		return errors.WithHint(errors.Newf("indexer mma rows: device %s is below sm_89", i.Arch()), "one launch per slot (TILERT_GPU_SLOT_MERGE=0)")
	}
	if cp || pair {
		return k.launchStaged("indexer_scores_mma_rows", pair, nq, T, s, qh, wq, cuda.DevPtr(cacheOff), rowBase, lens, out, T, ldOut, hist)
	}
	nbx := indexerMMABlocks(k.c.Info().SMs, 2, nq, T)
	return k.launch("indexer_scores_mma_rows", cuda.D3(nbx, nq, 1), cuda.D1(256), 0, s, qh, wq, cuda.DevPtr(cacheOff), rowBase, lens, out, T, ldOut, hist)
}

// indexerScoresMMA runs indexer_scores_mma_pf (pf: the next key group
// loaded before this one's products, two blocks per SM) or
// indexer_scores_mma (three blocks per SM).
func (k *Set) indexerScoresMMA(s cuda.Stream, out, qh, wq, cache, blockTable, lens, hist cuda.DevPtr, nq, T, ldOut int, pf bool) error {
	if nq <= 0 || T <= 0 || ldOut < T {
		return errors.Newf("indexer mma: nq=%d T=%d ldOut=%d", nq, T, ldOut)
	}
	if !k.IndexerMMASupported() {
		i := k.c.Info()
		return errors.WithHint(errors.Newf("indexer mma: device %s is below sm_89", i.Arch()), "use IndexerScores (TILERT_GPU_IDX_MMA=0)")
	}
	name, perSM := "indexer_scores_mma", 3
	if pf {
		name, perSM = "indexer_scores_mma_pf", 2
	}
	nbx := indexerMMABlocks(k.c.Info().SMs, perSM, nq, T)
	return k.launch(name, cuda.D3(nbx, nq, 1), cuda.D1(256), 0, s, qh, wq, cache, blockTable, lens, out, T, ldOut, hist)
}
