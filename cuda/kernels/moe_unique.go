package kernels

import (
	"sync/atomic"

	"github.com/cockroachdb/errors"

	"github.com/tilert-go/tilert/cuda"
)

// Routed experts read once a launch (cu/moe_unique.cu): MoEUnique groups a
// launch's routed slots by expert, ExpertsFP8Unique then runs each group's
// expert once for all its slots. Several rows a step that route to the same
// experts (a batch of similar requests, an MTP verify's token and draft)
// then read those experts' weights once instead of once a row.

// UniqueMaxSlots is the most routed slots MoEUnique takes (its one block).
const UniqueMaxSlots = 64

// UniqueTableInts is the length in int32 of MoEUnique's table for n slots
// in groups of at most mmax.
func UniqueTableInts(n, mmax int) int { return 2*n + n*mmax }

// UniqueLaunches counts ExpertsFP8Unique launches (tests).
var UniqueLaunches atomic.Int64

// UniqueTable is moe_unique's table computed on the host: the reference
// the kernel is checked against and what the engine's emulator writes.
func UniqueTable(ids []int32, mmax int) []int32 {
	n := len(ids)
	tab := make([]int32, UniqueTableInts(n, mmax))
	type key struct{ e, part int32 }
	g := map[key]int32{}
	seen := map[int32]int32{}
	groups := int32(0)
	for j, e := range ids {
		p := seen[e]
		seen[e]++
		k := key{e, p / int32(mmax)}
		gi, ok := g[k]
		if !ok {
			gi = groups
			g[k] = gi
			groups++
			tab[gi] = e
		}
		tab[int32(n)+gi]++
		tab[int32(2*n)+gi*int32(mmax)+p%int32(mmax)] = int32(j)
	}
	for i := groups; i < int32(n); i++ {
		tab[i] = -1
	}
	return tab
}

// UniqueGroupSlots is the mmax MoEUnique is to group by for a launch of
// rows input rows: the slots a group of ExpertsFP8Unique's kernel takes
// (each expert at most once a row), 4 or 8.
func UniqueGroupSlots(rows int) int {
	if rows <= 4 {
		return 4
	}
	return 8
}

// MoEUnique writes moe_unique's table of the n routed slots ids (int32,
// n <= UniqueMaxSlots) into tab (UniqueTableInts(n, mmax) int32), groups of
// at most mmax slots.
func (k *Set) MoEUnique(s cuda.Stream, tab, ids cuda.DevPtr, n, mmax int) error {
	if n <= 0 || n > UniqueMaxSlots || mmax <= 0 || mmax > MaxTileM || tab == 0 || ids == 0 {
		return errors.WithHint(errors.Newf("moe_unique: n=%d mmax=%d tab %#x ids %#x", n, mmax, uint64(tab), uint64(ids)),
			"pass 1..64 routed slots, groups of 1..8 and device buffers")
	}
	return k.launch("moe_unique", cuda.D1(1), cuda.D1(UniqueMaxSlots), 0, s, ids, n, mmax, tab)
}

// ExpertsFP8Unique is ExpertsFP8Shaped's routed slots (no dense slots) over
// MoEUnique's table tab of those slots, grouped for rows input rows: each
// group's expert is read once for its slots, and every slot's output is
// the one ExpertsFP8Shaped (same shapeSlots) gives it, bit for bit (the
// same group size G). Slot j reads x + (j / xdiv) * ldx and writes y + j*N.
func (k *Set) ExpertsFP8Unique(s cuda.Stream, y, x cuda.DevPtr, ldx, xdiv int, t, ts [2]cuda.DevPtr, tab cuda.DevPtr, slots, rows, N, K, shapeSlots int) error {
	if N <= 0 || K <= 0 || slots <= 0 || slots > UniqueMaxSlots || rows <= 0 || rows > MaxTileM || xdiv <= 0 || ldx < K {
		return errors.Newf("experts unique: N=%d K=%d slots=%d rows=%d xdiv=%d ldx=%d", N, K, slots, rows, xdiv, ldx)
	}
	if t[0] == 0 || tab == 0 {
		return errors.Newf("experts unique: the weight table and the unique table are needed (scale tables may be 0: scale 1, as ExpertsFP8)")
	}
	if !TileOK(x, K, ldx, 1) {
		return errors.Newf("experts unique: K=%d ldx=%d x=%#x: needs K %% 16 == 0, ldx %% 4 == 0 and aligned x", K, ldx, uint64(x))
	}
	if shapeSlots == 0 {
		shapeSlots = slots
	}
	// The per-slot launch's group size, so its sums.
	_, G, _ := k.tileKernel(tileLaunch{t0: t[0], ts0: ts[0], t1: t[1], ts1: ts[1], ids: tab, slots: slots,
		x: x, ldx: ldx, xdiv: xdiv, y: y, ldy: N, N: N, K: K, M: 1, shapeSlots: shapeSlots})
	mm := UniqueGroupSlots(rows)
	name, R := "gemv_tile_fp8_r4_m4_u", 4
	if mm == 8 {
		name, R = "gemv_tile_fp8_r2_m8_u", 2
	}
	rout := R
	if t[1] != 0 {
		rout = R / 2
	}
	tiles := cdiv(cdiv(N, rout), tileThreads/G)
	UniqueLaunches.Add(1)
	return k.launch(name, cuda.D3(min(tiles, 65535), slots, 1), cuda.D1(tileThreads), 0, s,
		t[0], ts[0], t[1], ts[1], tab, slots, mm, x, ldx, xdiv, y, N, N, K, G)
}

// uniqueMMAKernel is ExpertsFP8UniqueMMA's kernel (cu/moe_unique.cu).
const uniqueMMAKernel = "gemv_mmx_fp8_r2_u1_pu"

// UniqueMMAOK says whether ExpertsFP8UniqueMMA takes inputs x of rows of
// K fp8 weights' width, ldx apart: MMAOK's shape checks (the experts'
// weights behind the device tables are taken to be 16-byte aligned, as
// the loader allocates them).
func (k *Set) UniqueMMAOK(x cuda.DevPtr, K, ldx int) bool {
	return k.MMAOK(x, x, K, ldx, 1, 1)
}

// UniqueMMALaunches counts ExpertsFP8UniqueMMA launches (tests).
var UniqueMMALaunches atomic.Int64

// ExpertsFP8UniqueMMA is ExpertsFP8Unique on the tensor cores
// (gemv_mmx_fp8_r2_u1_pu): each group's expert is read once and its slots
// ride as the columns of gemv_mmx_fp8_r2_u1_p's mma, so slot j's output is
// GemvFP8MMA's (or GateUpFP8MMA's for a pair) for its row alone on its
// expert, bit for bit, not ExpertsFP8Shaped's (float32 products, the sums in
// the tensor cores' order). Slot j reads x + (j / xdiv) * ldx and writes
// y + j*N. sm_80+ (the caller checks MMAOK).
func (k *Set) ExpertsFP8UniqueMMA(s cuda.Stream, y, x cuda.DevPtr, ldx, xdiv int, t, ts [2]cuda.DevPtr, tab cuda.DevPtr, slots, rows, N, K int) error {
	if N <= 0 || K <= 0 || slots <= 0 || slots > UniqueMaxSlots || rows <= 0 || rows > MaxTileM || xdiv <= 0 || ldx < K {
		return errors.Newf("experts unique mma: N=%d K=%d slots=%d rows=%d xdiv=%d ldx=%d", N, K, slots, rows, xdiv, ldx)
	}
	if t[0] == 0 || ts[0] == 0 || tab == 0 || (t[1] != 0) != (ts[1] != 0) {
		return errors.Newf("experts unique mma: the weight and scale tables (both halves of a pair) and the unique table are needed")
	}
	if !k.UniqueMMAOK(x, K, ldx) {
		return errors.Newf("experts unique mma: K=%d ldx=%d x=%#x: needs K %% 16 == 0, ldx %% 4 == 0, aligned x and sm_80+", K, ldx, uint64(x))
	}
	tout := 2
	if t[1] != 0 {
		tout = 1
	}
	UniqueMMALaunches.Add(1)
	return k.launch(uniqueMMAKernel, cuda.D3(cdiv(N, 16*tout), slots, 1), cuda.D1(256), 0, s,
		t[0], ts[0], t[1], ts[1], tab, slots, UniqueGroupSlots(rows), x, ldx, xdiv, y, N, N, K)
}
