package kernels

import (
	"fmt"
	"math/rand/v2"
	"regexp"
	"strings"
	"testing"

	"github.com/tilert-go/tilert/cuda"
)

// TestKernelWQBIdxQ: the fused wq_b launch (cu/wqb_iq.cu) against the two
// launches it replaces, GemvFP8Tile on the same plan then AttnEpilogue, on
// fresh random inputs: wq_b's output, the latent row and indexer key
// written back, both caches, the query codes and the head weights bit for
// bit, twice in a row (the head counters must come back zeroed: they are
// read after each launch), on every plan it has a kernel for, capped grids
// (a block takes several tiles) and both models' wq_b shapes. Fails unless
// the fused kernel launched.
func TestKernelWQBIdxQ(t *testing.T) {
	defer func(r int) { TileRule = r }(TileRule)
	defer func() { forceTileG, forceTileR, forceTileV, forceTileB = 0, 0, "", 0 }()
	onGPU(t, func(c *cuda.Ctx, k *Set, a *allocs, r *rand.Rand) {
		s := c.Stream()
		const maxPos, rot, nPages = 4096, 64, 64
		cosT, sinT := ropeTables(maxPos, rot)
		cp, sp := a.up(cosT), a.up(sinT)
		cnt := a.up(make([]int32, IndexerQHeads))
		before := WQBIdxQLaunches()
		type cfg struct {
			IH, K       int
			G, R        int
			v           string
			B           int
			kv, idx     bool
			kvIL, idxIL bool
		}
		cfgs := []cfg{
			{64, 1536, 0, 0, "", 0, true, true, true, false},      // DeepSeek-V3.2's wq_b, the rule's plan
			{32, 2048, 0, 0, "", 0, true, true, false, true},      // GLM-5's
			{64, 1536, 64, 8, "_d16", 0, true, true, true, false}, // the plans by name
			{32, 2048, 128, 8, "_o4", 0, true, true, true, true},
			{64, 1536, 64, 8, "-", 0, true, true, false, false},
			{16, 1536, 32, 4, "_d16", 0, true, true, true, false},
			{16, 2048, 128, 4, "_o4", 0, false, true, true, false},
			{8, 512, 32, 4, "-", 0, true, false, true, true},
			{64, 1536, 64, 8, "_d16", -7, true, true, true, false}, // 7 blocks: each takes several tiles
			{32, 2048, 128, 8, "_o4", 1, true, true, false, true},  // one block an SM
			{64, 7168, 256, 8, "_d16", 0, true, true, true, false}, // tiles of 8 rows: 16 blocks a head
			{16, 96, 32, 2, "_d16", 0, true, true, true, false},    // the tiny presets' wq_b plans
			{16, 160, 32, 2, "-", 0, true, true, false, true},
			{16, 160, 32, 1, "-", 0, true, true, true, true},
		}
		for _, cf := range cfgs {
			tag := fmt.Sprintf("IH=%d K=%d G=%d R=%d%s B=%d kv=%v idx=%v il=%v/%v", cf.IH, cf.K, cf.G, cf.R, cf.v, cf.B,
				cf.kv, cf.idx, cf.kvIL, cf.idxIL)
			// Not t.Run: a subtest runs off the device thread, where the
			// context is not current.
			func(t *testing.T) {
				TileRule = 3
				forceTileG, forceTileR, forceTileV, forceTileB = cf.G, cf.R, cf.v, cf.B
				defer func() { forceTileG, forceTileR, forceTileV, forceTileB = 0, 0, "", 0 }()
				IH, K := cf.IH, cf.K
				N := IH * IndexerHeadDim
				name, _, _ := k.WQBIdxQKernel(N, K, a.raw(int64(4*K)), a.raw(int64(N*K)))
				if name == "" {
					t.Fatalf("no fused kernel for %s", tag)
				}
				t.Logf("%s: %s", tag, name)
				w, sc := a.up(randFP8(r, N*K)), a.up(randScales(r, cdiv(N, 128)*cdiv(K, 128), -6))
				x := a.up(randF32(r, K, 1))
				pos := []int32{int32(r.IntN(nPages * 64))}
				pp := a.up(pos)
				kva, ik, iw := randF32(r, 576, 2), randF32(r, 128, 1.5), randF32(r, IH, 1)
				kvw, ikw, ikb := a.up(randF32(r, 512, 1)), a.up(randF32(r, 128, 1)), a.up(randF32(r, 128, 0.3))
				iwp := a.up(iw)
				mlaInit, idxInit := randBytes(r, nPages*64*MLATokenBytes), randBytes(r, nPages*IndexerPageBytes)
				const wscale = 0.0123
				epi := func(kvp, ikp, y, mla, idx, qh, wq cuda.DevPtr) AttnEpilogue {
					e := AttnEpilogue{KVA: kvp, LdKV: 576, KVNorm: kvw, KVEps: 1e-6, KVInterleaved: cf.kvIL,
						IK: ikp, LdIK: 128, IKNormW: ikw, IKNormB: ikb, IKEps: 1e-6, IdxInterleaved: cf.idxIL,
						IQ: y, IW: iwp, IH: IH, WScale: wscale, Pos: pp, Cos: cp, Sin: sp, Rot: rot, Rows: 1, QH: qh, WQ: wq}
					if cf.kv {
						e.MLACache = mla
					}
					if cf.idx {
						e.IdxCache = idx
					}
					return e
				}
				// The two launches.
				kv1, ik1, mla1, idx1 := a.up(kva), a.up(ik), a.up(mlaInit), a.up(idxInit)
				y1, qh1, wq1 := a.poisoned(N), a.raw(IndexerQRowBytes), a.poisoned(IndexerQHeads)
				chk(k.GemvFP8Tile(s, y1, x, w, sc, 0, N, K, 1, K, N))
				chk(k.AttnEpilogue(s, epi(kv1, ik1, y1, mla1, idx1, qh1, wq1)))
				want := [][]byte{bytesF32(downF32(c, y1, N)), bytesF32(downF32(c, kv1, 576)), bytesF32(downF32(c, ik1, 128)),
					downBytes(c, mla1, len(mlaInit)), downBytes(c, idx1, len(idxInit)),
					downBytes(c, qh1, IndexerQRowBytes), bytesF32(downF32(c, wq1, IndexerQHeads))}
				for round := range 2 {
					kv2, ik2, mla2, idx2 := a.up(kva), a.up(ik), a.up(mlaInit), a.up(idxInit)
					y2, qh2, wq2 := a.poisoned(N), a.raw(IndexerQRowBytes), a.poisoned(IndexerQHeads)
					// Stale codes in the query rows: the fused launch must
					// write every head's, the zero heads past IH included.
					chk(c.MemsetD32(qh2, 0x5a5a5a5a, IndexerQRowBytes/4, s))
					chk(k.WQBIdxQ(s, WQBIdxQ{W: w, S: sc, X: x, Y: y2, N: N, K: K, Cnt: cnt,
						Epi: epi(kv2, ik2, y2, mla2, idx2, qh2, wq2)}))
					got := [][]byte{bytesF32(downF32(c, y2, N)), bytesF32(downF32(c, kv2, 576)), bytesF32(downF32(c, ik2, 128)),
						downBytes(c, mla2, len(mlaInit)), downBytes(c, idx2, len(idxInit)),
						downBytes(c, qh2, IndexerQRowBytes), bytesF32(downF32(c, wq2, IndexerQHeads))}
					bad := 0
					for i := range want {
						bad += diffBytes(want[i], got[i])
					}
					left := 0
					var cs [IndexerQHeads]int32
					chk(c.Download(cs[:], cnt))
					for _, v := range cs {
						if v != 0 {
							left++
						}
					}
					record(t, fmt.Sprintf("wq_b + epilogue (%s) vs tile GEMV + attn_epilogue, round %d, %s", name, round, tag),
						"mismatched bytes + nonzero head counters", float64(bad+left), 0)
				}
			}(t)
		}
		if WQBIdxQLaunches() == before {
			t.Fatal("the fused wq_b kernel never launched")
		}
	})
}

func bytesF32(v []float32) []byte {
	b, err := cuda.BytesOf(v)
	chk(err)
	return b
}

// TestWQBIdxQCheck: what the launcher refuses, before any launch (no GPU).
func TestWQBIdxQCheck(t *testing.T) {
	const p = cuda.DevPtr(1 << 20)
	testRefusals(t, func() WQBIdxQ {
		return WQBIdxQ{W: p, S: p, X: p, Y: p + 4096, N: 64 * IndexerHeadDim, K: 1536, Cnt: p,
			Epi: AttnEpilogue{KVA: p, LdKV: 576, KVNorm: p, MLACache: p, IK: p, LdIK: 128, IdxCache: p,
				IQ: p + 4096, IW: p, QH: p, WQ: p, IH: 64, Pos: p, Cos: p, Sin: p, Rot: 64, Rows: 1}}
	}, (*WQBIdxQ).Check, []refusal[WQBIdxQ]{
		{"two rows", func(a *WQBIdxQ) { a.Epi.Rows = 2 }, "one row"},
		{"row bases", func(a *WQBIdxQ) { a.Epi.Bases, a.Epi.MLACache, a.Epi.IdxCache, a.Epi.MLARows = p, 0, 0, true }, "one row"},
		{"no query part", func(a *WQBIdxQ) { a.Epi.QH = 0 }, "query part"},
		{"IQ not Y", func(a *WQBIdxQ) { a.Epi.IQ = p }, "query part"},
		{"N not heads x 128", func(a *WQBIdxQ) { a.N = 64*IndexerHeadDim - 128 }, "N must be"},
		{"K not x16", func(a *WQBIdxQ) { a.K = 1544 }, "K a multiple"},
		{"unaligned W", func(a *WQBIdxQ) { a.W = p + 8 }, "aligned"},
		{"no scales", func(a *WQBIdxQ) { a.S = 0 }, "scales"},
		{"no counters", func(a *WQBIdxQ) { a.Cnt = 0 }, "counters"},
	})
}

// refusal is one edit of a good launch that its Check must refuse, with
// a word the error must hold.
type refusal[T any] struct {
	name string
	edit func(*T)
	want string
}

// testRefusals: check refuses the zero value, accepts good(), and refuses
// every edit of it with an error naming what was wrong.
func testRefusals[T any](t *testing.T, good func() T, check func(*T) error, cases []refusal[T]) {
	t.Helper()
	var zero T
	if err := check(&zero); err == nil {
		t.Fatal("zero value accepted")
	}
	g := good()
	if err := check(&g); err != nil {
		t.Fatalf("good launch refused: %v", err)
	}
	for _, c := range cases {
		a := good()
		c.edit(&a)
		err := check(&a)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want an error with %q", c.name, err, c.want)
		}
	}
}

// TestWQBIdxQKernelsDefined: every plain tile kernel WQBIdxQKernel maps is
// in the module with its fused twin (name + "_iq"), launched as the plain
// one is (programmatically); the _o4 twins hold 3 blocks an SM of the
// plain kernel's 4, at 80 registers (TestNVRTCFusedTileRegisters).
func TestWQBIdxQKernelsDefined(t *testing.T) { testTwinsDefined(t, wqbIdxQKernels, "_iq", 9) }

// testTwinsDefined: the n plain kernels of twins and each one's fused twin
// (name + suffix) are defined in the default module, and the twin is on
// the same PDL lists as its plain kernel.
func testTwinsDefined(t *testing.T, twins map[string]bool, suffix string, n int) {
	t.Helper()
	src := KernelSource()
	if len(twins) != n {
		t.Fatalf("%d plain kernels with %s twins, want %d", len(twins), suffix, n)
	}
	for plain := range twins {
		for _, name := range []string{plain, plain + suffix} {
			if !regexp.MustCompile(`extern "C" __global__ void(?: __launch_bounds__\([^)]*\))?\s+` + name + `\(`).MatchString(src) {
				t.Errorf("%s is not defined in the kernels", name)
			}
		}
		if pdlKernels[plain] != pdlKernels[plain+suffix] || pdlMoreKernels[plain] != pdlMoreKernels[plain+suffix] {
			t.Errorf("%s%s is not launched as %s is (pdlKernels / pdlMoreKernels)", plain, suffix, plain)
		}
	}
}

// wqbTileHeads transcribes wqb_iq.cu's per-tile counting (gemv_tile_body's
// tile rows, IdxQEpi.tile_done): the heads tile bx's rows [r0, r1) add to,
// and how many rows each.
func wqbTileHeads(bx, G, R, N int) (heads, rows []int) {
	tr := (tileThreads / G) * R
	r0 := bx * tr
	r1 := min(r0+tr, N)
	for h := r0 / IndexerHeadDim; r0 < r1 && h <= (r1-1)/IndexerHeadDim && len(heads) < 4; h++ {
		a, b := max(r0, h*IndexerHeadDim), min(r1, (h+1)*IndexerHeadDim)
		heads, rows = append(heads, h), append(rows, b-a)
	}
	return heads, rows
}

// TestWQBIdxQHeadCounts (no GPU): on every fused plan's group size and
// rows, for wq_b shapes of 1..64 heads, the tiles' counted rows complete
// each head exactly once whatever order the blocks finish in (the
// completing add is the one that reaches 128, and it prepares the head),
// and no tile spans more heads than tile_done's list holds.
func TestWQBIdxQHeadCounts(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 32))
	for _, G := range []int{32, 64, 128, 256} {
		for _, R := range []int{1, 2, 4, 8} {
			for _, H := range []int{1, 3, 16, 32, 64} {
				N := H * IndexerHeadDim
				tiles := cdiv(cdiv(N, R), tileThreads/G)
				for trial := range 3 {
					cnt := make([]int, H)
					prepared := make([]int, H)
					for _, bx := range r.Perm(tiles) {
						heads, rows := wqbTileHeads(bx, G, R, N)
						if len(heads) > 2 {
							t.Fatalf("G=%d R=%d H=%d tile %d spans %d heads", G, R, H, bx, len(heads))
						}
						for i, h := range heads {
							cnt[h] += rows[i]
							if cnt[h] == IndexerHeadDim {
								prepared[h]++
								cnt[h] = 0 // the preparing warp's reset
							}
						}
					}
					for h := range H {
						if prepared[h] != 1 || cnt[h] != 0 {
							t.Fatalf("G=%d R=%d H=%d order %d: head %d prepared %d times, counter left %d", G, R, H, trial, h,
								prepared[h], cnt[h])
						}
					}
				}
			}
		}
	}
}

// TestKernelTimingWQBIdxQ (TILERT_GPU_TIMING=1): the fused wq_b against
// its two launches (GemvFP8Tile on the same plan, then AttnEpilogue) at
// both models' one-row shapes, direct and inside a CUDA graph, beside a
// device copy of 256 MiB (the table's reference rate); bytes are wq_b's
// weights and scales.
func TestKernelTimingWQBIdxQ(t *testing.T) {
	needTiming(t)
	onGPU(t, func(c *cuda.Ctx, k *Set, a *allocs, r *rand.Rand) {
		s := c.Stream()
		add := timingTable(t, c, a, r, 256<<20, "wq_b + epilogue: device-to-device copy 256 MiB (read+write)", "reference of this table")
		both := directAndGraph(c, s, add)
		const maxPos, rot = 4096, 64
		cosT, sinT := ropeTables(maxPos, rot)
		cp, sp := a.up(cosT), a.up(sinT)
		cnt := a.up(make([]int32, IndexerQHeads))
		pp := a.up([]int32{1000})
		for _, sh := range []struct {
			name  string
			IH, K int
		}{{"DeepSeek-V3.2 8192x1536", 64, 1536}, {"GLM-5 4096x2048", 32, 2048}} {
			N := sh.IH * IndexerHeadDim
			w, sc := a.up(randFP8(r, N*sh.K)), a.up(randScales(r, cdiv(N, 128)*cdiv(sh.K, 128), -6))
			x, y := a.up(randF32(r, sh.K, 1)), a.raw(int64(4*N))
			kv, ik, iw := a.up(randF32(r, 576, 1)), a.up(randF32(r, 128, 1)), a.up(randF32(r, sh.IH, 1))
			kvw, ikw, ikb := a.up(randF32(r, 512, 1)), a.up(randF32(r, 128, 1)), a.up(randF32(r, 128, 1))
			mla, idx := a.raw(int64(64*64*MLATokenBytes)), a.raw(int64(64*IndexerPageBytes))
			qh, wq := a.raw(IndexerQRowBytes), a.raw(4*IndexerQHeads)
			ep := AttnEpilogue{KVA: kv, LdKV: 576, KVNorm: kvw, KVEps: 1e-6, MLACache: mla, KVInterleaved: true,
				IK: ik, LdIK: 128, IKNormW: ikw, IKNormB: ikb, IKEps: 1e-6, IdxCache: idx,
				IQ: y, IW: iw, QH: qh, WQ: wq, IH: sh.IH, WScale: 0.01, Pos: pp, Cos: cp, Sin: sp, Rot: rot, Rows: 1}
			name, _, _ := k.WQBIdxQKernel(N, sh.K, x, w)
			bytes := float64(N*sh.K + 4*cdiv(N, 128)*cdiv(sh.K, 128))
			both(sh.name+" wq_b alone", bytes, func() { chk(k.GemvFP8Tile(s, y, x, w, sc, 0, N, sh.K, 1, sh.K, N)) })
			both(sh.name+" wq_b + attn_epilogue", bytes, func() {
				chk(k.GemvFP8Tile(s, y, x, w, sc, 0, N, sh.K, 1, sh.K, N))
				chk(k.AttnEpilogue(s, ep))
			})
			both(sh.name+" "+name, bytes, func() {
				chk(k.WQBIdxQ(s, WQBIdxQ{W: w, S: sc, X: x, Y: y, N: N, K: sh.K, Cnt: cnt, Epi: ep}))
			})
		}
	})
}
