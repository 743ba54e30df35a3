package gpu

import (
	"os"

	"github.com/cockroachdb/errors"

	"github.com/tilert-go/tilert/cuda"
	"github.com/tilert-go/tilert/cuda/kernels"
	"github.com/tilert-go/tilert/model"
)

// TILERT_GPU_MOE_UNIQUE: a round of several rows runs its routed experts
// grouped by expert (kernels.MoEUnique, then ExpertsFP8Unique for the
// gate/up and the down), so an expert that several rows routed to streams
// its weights once for all of them instead of once a row. Session 57 found
// the per-slot launches read every slot's expert: 4 slots whose rows route
// to the same experts (`bench decode --same-rows`) took as long as 4 rows
// of random routing (one H100, DeepSeek-V3.2 dims, 8192: 6.844 ms both,
// against 3.108 for one slot). Every slot's output keeps its bits (the same
// group size as the per-slot launch), so tokens and caches do not move.
// Only moeTile's launches with the shared expert on the side stream
// (sharedBeside) take it. =1: every round of 2 or more rows on the tile
// kernels (gemv_tile_fp8_r4_m4_u / r2_m8_u); =0: none. =x: every round of 2
// or more rows on the tensor-core kernel (kernels.ExpertsFP8UniqueMMA,
// gemv_mmx_fp8_r2_u1_pu): session 58 call A's trace of 4 same-row slots
// (one H100) had the tile kernels streaming the shared experts at 0.9-1.4
// TB/s, their MM FMAs a weight the cap; each slot's output is then the
// one-row tensor-core GEMV's, not the per-slot launch's (float32 products,
// another summation order).
//
// Unset: where the engine runs the dense GEMVs of several rows on the
// tensor cores (the experts' rows at least mmaMinN long, so the real
// models, not the tiny presets), =x's rounds. Session 58, one H100, 8192,
// DeepSeek-V3.2 dims, with TILERT_GPU_SIDE_SH_ONCE: call B against the tile
// kernels' rounds of 3-4 rows, 4 same-row slots 5.286 -> 3.888 ms and the
// MTP step of one slot 5.615 -> 5.655; call C against =1 without the shared
// expert once, each slot its own state, 4 slots 7.077 -> 6.380 (GLM-5 dims
// 6.527 -> 5.900), the MTP step of one slot 5.873 -> 5.591 and of 4 slots
// 17.69 -> 10.71 (one run each). (Call B's rows without --same-rows shared
// one bench state, so more experts than distinct requests do.) Elsewhere
// the tile kernels' rounds of 3 or 4 rows (session 57 call E: 4 slots -980
// / -964 us; 2 rows and 5-8 lost there), whose outputs keep the per-slot
// launches' bits.
var moeUniqueMode = os.Getenv("TILERT_GPU_MOE_UNIQUE")

// moeUniqueAuto is the rows a round takes the tile kernels' grouping at
// when the switch is unset and the tensor-core form is not the default.
func moeUniqueAuto(m int) bool { return m >= 3 && m <= 4 }

// moeMMAAuto says whether the unset switches take the tensor-core forms
// (the grouped experts on gemv_mmx_fp8_r2_u1_pu, the side shared expert
// once) for experts of MI x H: where the dense GEMVs of several rows take
// the tensor cores (mmaRule's mmaMinN, both shapes).
func moeMMAAuto(MI, H int) bool {
	return gemvMMAOn && MI >= mmaMinN && H >= mmaMinN
}

// mmaDefault is moeMMAAuto for this model's experts.
func (f *fwd) mmaDefault() bool {
	return moeMMAAuto(f.e.cfg.MoEIntermediateSize, f.e.cfg.HiddenSize)
}

// moeUniqueMMA says whether moeTile's grouped launches of a round take
// the tensor-core kernel.
func (f *fwd) moeUniqueMMA() bool {
	return moeUniqueMode == "x" || (moeUniqueMode == "" && f.mmaDefault())
}

// moeUnique says whether moeTile runs a round of m rows grouped by expert.
func (f *fwd) moeUnique(m int) bool {
	K := f.e.cfg.NumExpertsPerTok
	if m < 2 || m*K > kernels.UniqueMaxSlots || f.e.ws.uq == 0 {
		return false
	}
	switch moeUniqueMode {
	case "1", "x":
		return true
	case "":
		return f.moeUniqueMMA() || moeUniqueAuto(m)
	}
	return false
}

// uniqueTableInts is the workspace's unique table for up to M rows.
func uniqueTableInts(c *model.Config, M int) int {
	return kernels.UniqueTableInts(min(M, kernels.MaxTileM)*max(1, c.NumExpertsPerTok), kernels.MaxTileM)
}

func (b *cudaDevice) moeUnique(tab, ids cuda.DevPtr, n, mmax int) error {
	return b.k.MoEUnique(b.s, tab, ids, n, mmax)
}

func (b *cudaDevice) expertsUnique(y, x cuda.DevPtr, ldx, xdiv int, t, ts [2]cuda.DevPtr, tab cuda.DevPtr, slots, rows, N, K, shapeSlots int, mma bool) error {
	if mma && b.k.UniqueMMAOK(x, K, ldx) && ts[0] != 0 {
		return b.k.ExpertsFP8UniqueMMA(b.s, y, x, ldx, xdiv, t, ts, tab, slots, rows, N, K)
	}
	return b.k.ExpertsFP8Unique(b.s, y, x, ldx, xdiv, t, ts, tab, slots, rows, N, K, shapeSlots)
}

// moeUnique writes kernels.UniqueTable of the n ids at ids into tab.
func (m *emuDevice) moeUnique(tab, ids cuda.DevPtr, n, mmax int) error {
	if n <= 0 || n > kernels.UniqueMaxSlots || mmax <= 0 || mmax > kernels.MaxTileM {
		return errors.Newf("emu moe unique: n=%d mmax=%d", n, mmax)
	}
	id := append([]int32(nil), m.i32(ids, n)...)
	copy(m.i32(tab, kernels.UniqueTableInts(n, mmax)), kernels.UniqueTable(id, mmax))
	return nil
}

// expertsUnique runs each group's slots as experts runs a slot (mma too:
// the emulator's products are float32's either way).
func (m *emuDevice) expertsUnique(y, x cuda.DevPtr, ldx, xdiv int, t, ts [2]cuda.DevPtr, tab cuda.DevPtr, slots, rows, N, K, _ int, _ bool) error {
	if N <= 0 || K <= 0 || slots <= 0 || slots > kernels.UniqueMaxSlots || rows <= 0 || xdiv <= 0 || ldx < K {
		return errors.Newf("emu experts unique: N=%d K=%d slots=%d rows=%d xdiv=%d ldx=%d", N, K, slots, rows, xdiv, ldx)
	}
	mmax := kernels.UniqueGroupSlots(rows)
	tb := m.i32(tab, kernels.UniqueTableInts(slots, mmax))
	for g := 0; g < slots && tb[g] >= 0; g++ {
		for i := 0; i < int(tb[slots+g]); i++ {
			if err := m.routedSlot(y, x, ldx, xdiv, t, ts, int(tb[g]), int(tb[2*slots+g*mmax+i]), N, K); err != nil {
				return err
			}
		}
	}
	return nil
}

func (gb *graphDevice) moeUnique(tab, ids cuda.DevPtr, n, mmax int) error {
	return gb.rec("moeUnique", int64(4*n*(3+mmax)), func(b device) error { return b.moeUnique(tab, ids, n, mmax) },
		ku(tab), ku(ids), ki(n), ki(mmax))
}

func (gb *graphDevice) expertsUnique(y, x cuda.DevPtr, ldx, xdiv int, t, ts [2]cuda.DevPtr, tab cuda.DevPtr, slots, rows, N, K, shapeSlots int, mma bool) error {
	name, per := "expertsUnique", int64(1)
	if t[1] != 0 {
		name, per = "expertsUniqueGateUp", 2
	}
	mi := 0
	if mma {
		mi = 1
	}
	_ = gb.rec(name, per*int64(slots)*int64(N)*int64(K), func(b device) error {
		return b.expertsUnique(y, x, ldx, xdiv, t, ts, tab, slots, rows, N, K, shapeSlots, mma)
	}, ku(y), ku(x), ki(ldx), ki(xdiv), ku(t[0]), ku(t[1]), ku(ts[0]), ku(ts[1]), ku(tab), ki(slots), ki(rows), ki(N), ki(K), ki(shapeSlots), ki(mi))
	return gb.shaped(slots, N, K)
}

// TILERT_GPU_SIDE_SH_ONCE=1: the side stream's shared expert (sharedBeside)
// of M >= 2 rows streams its weights once for all rows (gateUp and gemvFP8
// over M rows: the tensor-core GEMVs past 2 rows) instead of as a dense
// slot a row of the routed launches' shape, which read it M times (session
// 58 call A's trace, 4 slots: 52 + 43 us a layer on the side stream, 176
// MB). Its outputs then differ from the per-slot launch's in the last bits.
// 0: a dense slot a row. Unset: once where moeMMAAuto says (session 58 call
// B, 4 same-row slots: 5.286 ms with neither, 5.161 with this alone, 4.079
// with the grouped experts on the tensor cores alone, 3.888 with both).
var sideShOnceMode = os.Getenv("TILERT_GPU_SIDE_SH_ONCE")

// sharedOnce says whether sharedShaped runs M rows' shared expert once.
func (f *fwd) sharedOnce(M int) bool {
	return M >= 2 && (sideShOnceMode == "1" || (sideShOnceMode == "" && f.mmaDefault()))
}
