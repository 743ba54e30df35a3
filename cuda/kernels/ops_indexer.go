package kernels

import (
	"strconv"

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
	return k.indexerScoresMMA(s, out, qh, wq, cache, blockTable, lens, hist, nq, T, ldOut, true)
}

// IndexerScoresMMARows is IndexerScoresMMA over rows of different caches
// (slots) in one launch: row r's pages start at rowBase[r] + cacheOff
// (rowBase: nq int64 in device memory; cacheOff the layer's offset in
// every slot's region). The same scores as one launch per cache.
func (k *Set) IndexerScoresMMARows(s cuda.Stream, out, qh, wq cuda.DevPtr, cacheOff int64, rowBase, lens, hist cuda.DevPtr, nq, T, ldOut int) error {
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

// IndexerMMADepths are the ring depths IndexerScoresMMADeep takes (the
// 16-key groups a warp keeps in flight: indexer_scores_mma_d2 / _d3 / _d4).
var IndexerMMADepths = []int{2, 3, 4}

// IndexerMMADeepDepth is the depth the engine's long rows use
// (TILERT_GPU_IDX_LONG): at 131072 keys and one row a warp has 4 groups
// (indexerMMABlocks), all of them in flight at once.
const IndexerMMADeepDepth = 4

// indexerDeepSmem is the deep kernel's dynamic shared memory (its ring:
// IDXD_SLOT_BYTES = 2560 bytes a warp a slot, 8 warps); with the 32 KB
// static two blocks fit an SM (2 x 112 KB at depth 4).
func indexerDeepSmem(depth int) int { return depth * 8 * 2560 }

func indexerMMADeepName(depth int, rows bool) (string, error) {
	for _, d := range IndexerMMADepths {
		if d == depth {
			if rows {
				return "indexer_scores_mma_rows_d" + strconv.Itoa(depth), nil
			}
			return "indexer_scores_mma_d" + strconv.Itoa(depth), nil
		}
	}
	return "", errors.WithHint(errors.Newf("indexer mma deep: depth %d", depth), "take one of kernels.IndexerMMADepths")
}

// IndexerScoresMMADeep is IndexerScoresMMA (same arguments, same scores
// bit for bit: the same products and float32 sums; the same histogram)
// with depth of each warp's 16-key groups, keys and scales, loaded at once
// before their products (indexer_mma.cu's idx_scores_deep_body): for long
// rows, where IndexerScoresMMA's one group in flight leaves each warp
// waiting on memory once or twice a group.
func (k *Set) IndexerScoresMMADeep(s cuda.Stream, out, qh, wq, cache, blockTable, lens, hist cuda.DevPtr, nq, T, ldOut, depth int) error {
	if nq <= 0 || nq > 65535 || T <= 0 || ldOut < T {
		return errors.Newf("indexer mma deep: nq=%d (1..65535) T=%d ldOut=%d (>= T)", nq, T, ldOut)
	}
	if out == 0 || qh == 0 || wq == 0 || cache == 0 || lens == 0 {
		return errors.Newf("indexer mma deep: out %#x qh %#x wq %#x cache %#x lens %#x", uint64(out), uint64(qh), uint64(wq), uint64(cache), uint64(lens))
	}
	name, err := indexerMMADeepName(depth, false)
	if err != nil {
		return err
	}
	if !k.IndexerMMASupported() {
		i := k.c.Info()
		return errors.WithHint(errors.Newf("indexer mma deep: device %s is below sm_89", i.Arch()), "use IndexerScores (TILERT_GPU_IDX_MMA=0)")
	}
	return k.launchDeep(name, depth, s, nq, T, qh, wq, cache, blockTable, lens, out, T, ldOut, hist)
}

// launchDeep launches a deep scores kernel over nq rows of T keys (the
// rest of the arguments its own) with its ring in dynamic shared memory.
func (k *Set) launchDeep(name string, depth int, s cuda.Stream, nq, T int, args ...any) error {
	f, err := k.fn(name)
	if err != nil {
		return err
	}
	smem := indexerDeepSmem(depth)
	if _, ok := bigShared.Load(f); !ok {
		if err := k.c.SetMaxDynamicShared(f, smem); err != nil {
			return errors.WithHint(errors.Wrapf(err, "%s: %d bytes of dynamic shared memory", name, smem), "a smaller depth, or TILERT_GPU_IDX_LONG=0")
		}
		// Two blocks an SM need 2 x (32 KB static + the ring): at depth 4
		// 224 of the H200's 228 KB, so ask for the most shared memory
		// rather than leave the split to the driver.
		if err := k.c.PreferMaxShared(f); err != nil {
			return errors.WithHint(errors.Wrap(err, name), "TILERT_GPU_IDX_LONG=0 runs the scores kernel before")
		}
		bigShared.Store(f, true)
	}
	nbx := indexerMMABlocks(k.c.Info().SMs, 2, nq, T)
	return k.launchFn(f, cuda.D3(nbx, nq, 1), cuda.D1(256), smem, s, args...)
}

// IndexerScoresMMARowsDeep is IndexerScoresMMARows (same arguments and
// scores) on the deep kernel (IndexerScoresMMADeep).
func (k *Set) IndexerScoresMMARowsDeep(s cuda.Stream, out, qh, wq cuda.DevPtr, cacheOff int64, rowBase, lens, hist cuda.DevPtr, nq, T, ldOut, depth int) error {
	if rowBase == 0 {
		return errors.WithHint(errors.New("indexer mma rows deep: no row bases"), "pass the slots' cache bases (nq int64 in device memory)")
	}
	if nq <= 0 || nq > 65535 || T <= 0 || ldOut < T {
		return errors.Newf("indexer mma rows deep: nq=%d (1..65535) T=%d ldOut=%d (>= T)", nq, T, ldOut)
	}
	name, err := indexerMMADeepName(depth, true)
	if err != nil {
		return err
	}
	if !k.IndexerMMASupported() {
		i := k.c.Info()
		return errors.WithHint(errors.Newf("indexer mma rows deep: device %s is below sm_89", i.Arch()), "one launch per slot (TILERT_GPU_SLOT_MERGE=0)")
	}
	return k.launchDeep(name, depth, s, nq, T, qh, wq, cuda.DevPtr(cacheOff), rowBase, lens, out, T, ldOut, hist)
}
