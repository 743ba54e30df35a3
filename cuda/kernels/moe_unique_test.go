package kernels

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/tilert-go/tilert/cuda"
)

// checkUniqueTable says what is wrong with tab as the grouping of ids in
// groups of at most mmax slots, or "": every slot in exactly one group of
// its expert, groups in the order of their first slots, slots in order.
func checkUniqueTable(ids, tab []int32, mmax int) string {
	n := len(ids)
	seen := make([]bool, n)
	last := int32(-1)
	for g := range n {
		e, cnt := tab[g], int(tab[n+g])
		if e < 0 {
			if cnt != 0 {
				return fmt.Sprintf("group %d: no expert but %d slots", g, cnt)
			}
			for h := g; h < n; h++ {
				if tab[h] >= 0 {
					return fmt.Sprintf("group %d after the end (group %d)", h, g)
				}
			}
			break
		}
		if cnt < 1 || cnt > mmax {
			return fmt.Sprintf("group %d: %d slots (1..%d)", g, cnt, mmax)
		}
		sl := tab[2*n+g*mmax : 2*n+g*mmax+cnt]
		if sl[0] <= last || !slices.IsSorted(sl) {
			return fmt.Sprintf("group %d: slots %v out of order", g, sl)
		}
		last = sl[0]
		for _, j := range sl {
			if j < 0 || int(j) >= n || seen[j] || ids[j] != e {
				return fmt.Sprintf("group %d (expert %d): slot %d bad or seen twice", g, e, j)
			}
			seen[j] = true
		}
	}
	for j, s := range seen {
		if !s {
			return fmt.Sprintf("slot %d (expert %d) in no group", j, ids[j])
		}
	}
	return ""
}

// uniqueCases: ids of rows x k slots, from all distinct to all the same,
// with an expert that repeats within a row (past mmax).
func uniqueCases(r *rand.Rand) [][]int32 {
	var cs [][]int32
	for _, rows := range []int{1, 2, 4, 8} {
		for _, pool := range []int{256, 16, 8} {
			ids := make([]int32, rows*8)
			for m := range rows {
				perm := r.Perm(pool)
				for i := range 8 {
					ids[m*8+i] = int32(perm[i%len(perm)])
				}
			}
			cs = append(cs, ids)
		}
	}
	same := make([]int32, 64)
	for i := range same {
		same[i] = 7
	}
	return append(cs, same, []int32{3}, []int32{5, 5, 5, 5, 5, 1, 5})
}

func TestUniqueTable(t *testing.T) {
	r := rand.New(rand.NewPCG(testSeed(t), 3))
	for _, ids := range uniqueCases(r) {
		for _, mmax := range []int{4, 8} {
			if msg := checkUniqueTable(ids, UniqueTable(ids, mmax), mmax); msg != "" {
				t.Errorf("UniqueTable(%v, %d): %s", ids, mmax, msg)
			}
		}
	}
	// The check itself fails on a wrong table.
	ids := []int32{1, 2, 1}
	bad := UniqueTable(ids, 4)
	bad[2*3+0] = 1 // group 0's first slot now slot 1 (expert 2)
	if checkUniqueTable(ids, bad, 4) == "" {
		t.Error("checkUniqueTable passed a table with a slot in another expert's group")
	}
}

// TestNVRTCUniqueCompiles: the unique kernels compile for sm_90 without
// spills, the grouped GEMVs within 128 registers (two blocks an SM).
func TestNVRTCUniqueCompiles(t *testing.T) {
	// The tensor-core form uses gemv_mma_x.cu's body (the module's files
	// in order: gemv_mma*.cu sort before moe_unique.cu).
	hdr := append(slices.Clone(defaultHeaders), "cu/gemv_mma.cu", "cu/gemv_mma_x.cu")
	log, version := ptxasLogSM90(t, moduleSource(kernelFS, "cu/moe_unique.cu", hdr...), "moe_unique.cu")
	lims := []regLimit{{"gemv_tile_fp8_r4_m4_u", 128}, {"gemv_tile_fp8_r2_m8_u", 128}, {"gemv_mmx_fp8_r2_u1_pu", 128}, {"moe_unique", 64}}
	checkRegisters(t, log, version, lims)
	sp, _ := ptxasSpills(log)
	for _, l := range lims {
		if sp[l.name] != "" {
			t.Errorf("%s spills %s bytes (NVRTC %s)", l.name, sp[l.name], version)
		}
	}
}

// TestKernelExpertsUnique: moe_unique's table equals UniqueTable on fresh
// ids (all distinct to all the same); then the routed gate/up (paired, with
// SwiGLU) and down of rows x 8 slots over those groups equal the per-slot
// launches (ExpertsFP8Shaped, the same shape slots) bit for bit, and the
// CPU reference.
func TestKernelExpertsUnique(t *testing.T) {
	onGPU(t, func(c *cuda.Ctx, k *Set, a *allocs, r *rand.Rand) {
		s := c.Stream()
		for _, ids := range uniqueCases(r) {
			for _, mmax := range []int{4, 8} {
				tab := a.raw(int64(4 * UniqueTableInts(len(ids), mmax)))
				chk(k.MoEUnique(s, tab, a.up(ids), len(ids), mmax))
				got := downI32(c, tab, UniqueTableInts(len(ids), mmax))
				want := UniqueTable(ids, mmax)
				if !slices.Equal(got, want) {
					t.Errorf("moe_unique(%v, %d) = %v, want %v", ids, mmax, got, want)
				}
			}
		}
		const H, I, top = uqH, uqI, uqTop
		b := newUniqueBank(r, a)
		tabW, tabS := b.tabW, b.tabS
		eachUniqueCase(r, a, func(uc uniqueCase) {
			slots, rows, hp, idp, tab, mmax := uc.slots, uc.rows, uc.hp, uc.idp, uc.tab, uc.mmax
			gu1, gu2 := a.poisoned(slots*I), a.poisoned(slots*I)
			yd1, yd2 := a.poisoned(slots*H), a.poisoned(slots*H)
			shape := slots + rows // as beside a shared expert's dense slot a row
			chk(k.ExpertsFP8Shaped(s, gu1, hp, H, top, 0, [2]cuda.DevPtr{tabW[0], tabW[1]}, [2]cuda.DevPtr{tabS[0], tabS[1]}, idp, slots,
				[2]cuda.DevPtr{}, [2]cuda.DevPtr{}, 0, I, H, shape))
			chk(k.ExpertsFP8Shaped(s, yd1, gu1, I, 1, 0, [2]cuda.DevPtr{tabW[2]}, [2]cuda.DevPtr{tabS[2]}, idp, slots,
				[2]cuda.DevPtr{}, [2]cuda.DevPtr{}, 0, H, I, shape))
			n0 := UniqueLaunches.Load()
			chk(k.MoEUnique(s, tab, idp, slots, mmax))
			chk(k.ExpertsFP8Unique(s, gu2, hp, H, top, [2]cuda.DevPtr{tabW[0], tabW[1]}, [2]cuda.DevPtr{tabS[0], tabS[1]}, tab, slots, rows, I, H, shape))
			chk(k.ExpertsFP8Unique(s, yd2, gu2, I, 1, [2]cuda.DevPtr{tabW[2]}, [2]cuda.DevPtr{tabS[2]}, tab, slots, rows, H, I, shape))
			if n := UniqueLaunches.Load() - n0; n != 2 {
				t.Errorf("%d unique launches, want 2", n)
			}
			b.check(t, c, uc, fmt.Sprintf("experts unique %d rows, %d of %d experts", rows, uc.pool, uqE), "per slot", gu1, gu2, yd1, yd2)
		})
	})
}

// TestKernelExpertsUniqueMMA: gemv_mmx_fp8_r2_u1_pu gives each slot what
// gemv_mmx_fp8_r2_u1_p (GateUpFP8MMA / GemvFP8MMA pinned to it) gives its
// row alone on its expert, bit for bit, whatever the group's other rows;
// the down against the CPU reference over the gate/up it was fed.
func TestKernelExpertsUniqueMMA(t *testing.T) {
	onGPU(t, func(c *cuda.Ctx, k *Set, a *allocs, r *rand.Rand) {
		defer func() { forceMMART, forceMMAU, forceMMAP, forceMMAX = 0, 0, -1, -1 }()
		forceMMART, forceMMAU, forceMMAP, forceMMAX = 2, 1, 1, 1
		s := c.Stream()
		const H, I, top = uqH, uqI, uqTop
		b := newUniqueBank(r, a)
		tabW, tabS := b.tabW, b.tabS
		eachUniqueCase(r, a, func(uc uniqueCase) {
			slots, rows, hp, idp, tab, mmax := uc.slots, uc.rows, uc.hp, uc.idp, uc.tab, uc.mmax
			gu, yd := a.poisoned(slots*I), a.poisoned(slots*H)
			n0 := UniqueMMALaunches.Load()
			chk(k.MoEUnique(s, tab, idp, slots, mmax))
			chk(k.ExpertsFP8UniqueMMA(s, gu, hp, H, top, [2]cuda.DevPtr{tabW[0], tabW[1]}, [2]cuda.DevPtr{tabS[0], tabS[1]}, tab, slots, rows, I, H))
			chk(k.ExpertsFP8UniqueMMA(s, yd, gu, I, 1, [2]cuda.DevPtr{tabW[2]}, [2]cuda.DevPtr{tabS[2]}, tab, slots, rows, H, I))
			if n := UniqueMMALaunches.Load() - n0; n != 2 {
				t.Errorf("%d unique mma launches, want 2", n)
			}
			// Each slot alone: its row, its expert, one row.
			gu1, yd1 := a.poisoned(slots*I), a.poisoned(slots*H)
			for j, e := range uc.ids {
				f := func(p cuda.DevPtr, i int) cuda.DevPtr { return p.Add(int64(4 * i)) }
				chk(k.GateUpFP8MMA(s, f(gu1, j*I), f(hp, (j/top)*H), b.gate.wp[e], b.gate.sp[e], b.up.wp[e], b.up.sp[e], I, H, 1, H, I))
				chk(k.GemvFP8MMA(s, f(yd1, j*H), f(gu, j*I), b.down.wp[e], b.down.sp[e], 0, H, I, 1, I, H))
			}
			b.check(t, c, uc, fmt.Sprintf("experts unique mma %d rows, %d of %d experts", rows, uc.pool, uqE), "its row alone", gu1, gu, yd1, yd)
		})
	})
}

// uniqueBank is the grouped-expert tests' bank: E fp8 experts of I x H
// (gate, up) and H x I (down), their device pointer tables, and top picks a
// row.
type uniqueBank struct {
	gate, up, down fp8Experts
	tabW, tabS     [3]cuda.DevPtr
}

const uqE, uqH, uqI, uqTop = 16, 1024, 512, 8

func newUniqueBank(r *rand.Rand, a *allocs) uniqueBank {
	b := uniqueBank{gate: randFP8Experts(r, a, uqE, uqI, uqH), up: randFP8Experts(r, a, uqE, uqI, uqH), down: randFP8Experts(r, a, uqE, uqH, uqI)}
	b.tabW = [3]cuda.DevPtr{a.up(b.gate.wp), a.up(b.up.wp), a.up(b.down.wp)}
	b.tabS = [3]cuda.DevPtr{a.up(b.gate.sp), a.up(b.up.sp), a.up(b.down.sp)}
	return b
}

// uniqueCase is one launch's input: rows x top routed slots drawn from the
// first pool experts (each row's picks distinct), their input rows and a
// table buffer grouped by mmax.
type uniqueCase struct {
	rows, pool, slots, mmax int
	ids                     []int32
	hp, idp, tab            cuda.DevPtr
}

// eachUniqueCase runs f on 2, 3, 4 and 8 rows over pools from all 16
// experts down to 8 (every row then shares most of its experts).
func eachUniqueCase(r *rand.Rand, a *allocs, f func(uc uniqueCase)) {
	for _, rows := range []int{2, 3, 4, 8} {
		for _, pool := range []int{uqE, 9, 8} {
			ids := make([]int32, rows*uqTop)
			for m := range rows {
				perm := r.Perm(pool)
				for i := range uqTop {
					ids[m*uqTop+i] = int32(perm[i])
				}
			}
			mmax := UniqueGroupSlots(rows)
			f(uniqueCase{rows: rows, pool: pool, slots: len(ids), mmax: mmax, ids: ids, hp: a.up(randF32(r, rows*uqH, 1)),
				idp: a.up(ids), tab: a.raw(int64(4 * UniqueTableInts(len(ids), mmax)))})
		}
	}
}

// check records the grouped gate/up gu and down yd of case uc against the
// launches they must equal bit for bit (guRef, ydRef: named ref), and the
// down against the CPU reference over the gate/up it was fed.
func (b uniqueBank) check(t *testing.T, c *cuda.Ctx, uc uniqueCase, name, ref string, guRef, gu, ydRef, yd cuda.DevPtr) {
	t.Helper()
	n := uc.slots
	g1, g2 := downF32(c, guRef, n*uqI), downF32(c, gu, n*uqI)
	d1, d2 := downF32(c, ydRef, n*uqH), downF32(c, yd, n*uqH)
	record(t, name+": gate/up == "+ref, "differing outputs", float64(diffCount(g2, g1)), 0)
	record(t, name+": down == "+ref, "differing outputs", float64(diffCount(d2, d1)), 0)
	want := make([]float64, n*uqH)
	for j, e := range uc.ids {
		copy(want[j*uqH:], refGemv(b.down.at(int(e)), g2[j*uqI:], nil, uqH, uqI, 1, uqI, uqH))
	}
	record(t, name+": down", relMetric, relErr(d2, want), boundF32)
}
