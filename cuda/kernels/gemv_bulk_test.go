package kernels

import (
	"fmt"
	"math/rand/v2"
	"os"
	"strings"
	"testing"

	"github.com/tilert-go/tilert/cuda"
)

// TestKernelGemvBulk checks the bulk-copy GEMV (gemv_bulk_fp8, sm_90a
// module) on fresh random inputs: against the float64 reference at the
// tile kernel's bound (dense, with residual, gate-up paired, routed +
// shared experts), two launches bit-identical, and bit-identical to the
// tile kernel of the same group size (its summation order), for the
// launcher's group size and pinned ones, two and one blocks per SM, on
// N not a multiple of the row tile and K = 1536, 2048, 7168, 16384 and
// K % (16 G) != 0.
func TestKernelGemvBulk(t *testing.T) {
	needBulkCheck(t)
	defer func() { forceBulkG, forceBulkB, forceTileG = 0, 0, 0 }()
	onGPU(t, func(c *cuda.Ctx, k *Set, a *allocs, r *rand.Rand) {
		if err := k.WGSupported(); err != nil {
			if i := c.Info(); i.CCMajor == 9 && i.CCMinor == 0 {
				t.Fatalf("the sm_90a module does not load on this 9.0 device: %+v", err)
			}
			t.Skipf("no sm_90a module here: %v", err)
		}
		s := c.Stream()
		for _, cf := range []struct{ G, B int }{{0, 0}, {0, 1}, {32, 0}, {128, 0}, {256, 1}} {
			forceBulkG, forceBulkB, forceTileG = cf.G, cf.B, cf.G
			tag := fmt.Sprintf(" G=%d B=%d", cf.G, cf.B)
			// Dense, with and without a residual.
			for _, cs := range []gemvCase{
				{7168, 16384, 1, 0, false}, {24576, 1536, 1, 0, true}, {1000, 1536, 1, 0, false}, {333, 2048, 1, 0, true},
				{130, 7168, 1, 0, false}, {77, 16384, 1, 0, true}, {129, 1040, 1, 0, true}, {5, 16, 1, 0, false},
			} {
				if cf.G != 0 && cs.N*cs.K > 4<<20 {
					continue // the big shapes once per blocks-per-SM setting
				}
				N, K := cs.N, cs.K
				w := randFP8(r, N*K)
				sc := randScales(r, cdiv(N, 128)*cdiv(K, 128), -8)
				x, resid, rp := gemvRows(r, a, cs)
				xp, wp, sp := a.up(x), a.up(w), a.up(sc)
				var runs [2][]float32
				for i := range runs {
					yp := a.poisoned(N)
					chk(k.GemvFP8Bulk(s, yp, xp, wp, sp, rp, N, K))
					runs[i] = downF32(c, yp, N)
				}
				yt := a.poisoned(N)
				chk(k.GemvFP8Tile(s, yt, xp, wp, sp, rp, N, K, 1, K, N))
				name := "gemv_bulk_fp8 " + cs.dims() + fmt.Sprintf(" resid=%v", cs.resid) + tag
				record(t, name, relMetric, relErr(runs[0], refGemv(fp8At(w, sc, K), x, resid, N, K, 1, K, N)), boundF32)
				record(t, name+" repeat", "differing outputs", float64(diffCount(runs[0], runs[1])), 0)
				record(t, name+" == tile", "differing outputs", float64(diffCount(runs[0], downF32(c, yt, N))), 0)
			}
			// In place: resid == y.
			{
				N, K := 300, 2048
				w, sc := randFP8(r, N*K), randScales(r, cdiv(N, 128)*cdiv(K, 128), -8)
				x, y0 := randF32(r, K, 1), randF32(r, N, 1)
				yp := a.up(y0)
				chk(k.GemvFP8Bulk(s, yp, a.up(x), a.up(w), a.up(sc), yp, N, K))
				record(t, fmt.Sprintf("gemv_bulk_fp8 N=%d K=%d resid=y", N, K)+tag, relMetric,
					relErr(downF32(c, yp, N), refGemv(fp8At(w, sc, K), x, y0, N, K, 1, K, N)), boundF32)
			}
			// Gate, up and SwiGLU paired.
			for _, nk := range [][2]int{{2048, 7168}, {300, 2048}, {130, 1536}} {
				N, K := nk[0], nk[1]
				wg, wu := randFP8(r, N*K), randFP8(r, N*K)
				sg, su := randScales(r, cdiv(N, 128)*cdiv(K, 128), -8), randScales(r, cdiv(N, 128)*cdiv(K, 128), -8)
				x := randF32(r, K, 1)
				xp, wgp, sgp, wup, sup := a.up(x), a.up(wg), a.up(sg), a.up(wu), a.up(su)
				yp, yt := a.poisoned(N), a.poisoned(N)
				chk(k.GateUpFP8Bulk(s, yp, xp, wgp, sgp, wup, sup, N, K))
				chk(k.GateUpFP8(s, yt, xp, wgp, sgp, wup, sup, N, K, 1, K, N))
				got := downF32(c, yp, N)
				ref := refSiluMul(refGemv(fp8At(wg, sg, K), x, nil, N, K, 1, K, N), refGemv(fp8At(wu, su, K), x, nil, N, K, 1, K, N))
				name := fmt.Sprintf("gemv_bulk_fp8 gate-up N=%d K=%d", N, K) + tag
				record(t, name, relMetric, relErr(got, ref), boundF32)
				record(t, name+" == tile", "differing outputs", float64(diffCount(got, downF32(c, yt, N))), 0)
			}
			// Routed experts + the shared expert (gate-up paired, then down
			// on its output), against the float64 reference and the tile
			// kernel's bits, shaped alike.
			const E, top, H, I = 12, 8, 2048, 384
			var ex [3]fp8Experts
			var tabW, tabS, shW, shS [3]cuda.DevPtr
			dims := [3][2]int{{I, H}, {I, H}, {H, I}}
			for p := range 3 {
				ex[p] = randFP8Experts(r, a, E+1, dims[p][0], dims[p][1])
				tabW[p], tabS[p] = a.up(ex[p].wp[:E]), a.up(ex[p].sp[:E])
				shW[p], shS[p] = ex[p].wp[E], ex[p].sp[E]
			}
			ids := make([]int32, top)
			for j, e := range r.Perm(E)[:top] {
				ids[j] = int32(e)
			}
			ids[top-1] = ids[0]
			h := randF32(r, H, 1)
			hp, idp := a.up(h), a.up(ids)
			gu, gut := a.poisoned((top+1)*I), a.poisoned((top+1)*I)
			gT, gS := [2]cuda.DevPtr{tabW[0], tabW[1]}, [2]cuda.DevPtr{tabS[0], tabS[1]}
			gW, gSW := [2]cuda.DevPtr{shW[0], shW[1]}, [2]cuda.DevPtr{shS[0], shS[1]}
			chk(k.ExpertsFP8Bulk(s, gu, hp, H, top, 0, gT, gS, idp, top, gW, gSW, 1, I, H, 0))
			chk(k.ExpertsFP8(s, gut, hp, H, top, 0, gT, gS, idp, top, gW, gSW, 1, I, H))
			guGot := downF32(c, gu, (top+1)*I)
			guRef := make([]float64, (top+1)*I)
			for j := range top + 1 {
				e := E
				if j < top {
					e = int(ids[j])
				}
				copy(guRef[j*I:], refSiluMul(refGemv(ex[0].at(e), h, nil, I, H, 1, H, I), refGemv(ex[1].at(e), h, nil, I, H, 1, H, I)))
			}
			record(t, fmt.Sprintf("gemv_bulk_fp8 experts gate-up %d+1 slots H=%d I=%d", top, H, I)+tag, relMetric, relErr(guGot, guRef), boundF32)
			record(t, fmt.Sprintf("gemv_bulk_fp8 experts gate-up %d+1 slots == tile", top)+tag, "differing outputs",
				float64(diffCount(guGot, downF32(c, gut, (top+1)*I))), 0)
			yd, ydt := a.poisoned((top+1)*H), a.poisoned((top+1)*H)
			dT, dS := [2]cuda.DevPtr{tabW[2]}, [2]cuda.DevPtr{tabS[2]}
			dW, dSW := [2]cuda.DevPtr{shW[2]}, [2]cuda.DevPtr{shS[2]}
			chk(k.ExpertsFP8Bulk(s, yd, gu, I, 1, top, dT, dS, idp, top, dW, dSW, 1, H, I, 0))
			chk(k.ExpertsFP8(s, ydt, gu, I, 1, top, dT, dS, idp, top, dW, dSW, 1, H, I))
			ydGot := downF32(c, yd, (top+1)*H)
			ydRef := make([]float64, (top+1)*H)
			for j := range top + 1 {
				e := E
				if j < top {
					e = int(ids[j])
				}
				copy(ydRef[j*H:], refGemv(ex[2].at(e), guGot[j*I:], nil, H, I, 1, I, H))
			}
			record(t, fmt.Sprintf("gemv_bulk_fp8 experts down %d+1 slots H=%d I=%d", top, H, I)+tag, relMetric, relErr(ydGot, ydRef), boundF32)
			record(t, fmt.Sprintf("gemv_bulk_fp8 experts down %d+1 slots == tile", top)+tag, "differing outputs",
				float64(diffCount(ydGot, downF32(c, ydt, (top+1)*H))), 0)
		}
	})
}

// TestGemvBulkArgs: bad arguments are refused, before any module is
// loaded, with errors that name the problem (no GPU needed).
func TestGemvBulkArgs(t *testing.T) {
	var k Set
	const x, w, y = cuda.DevPtr(1 << 20), cuda.DevPtr(2 << 20), cuda.DevPtr(3 << 20)
	for _, c := range []struct {
		name string
		f    func() error
		want string
	}{
		{"K % 16", func() error { return k.GemvFP8Bulk(0, y, x, w, 0, 0, 64, 100) }, "K a positive multiple of 16"},
		{"N = 0", func() error { return k.GemvFP8Bulk(0, y, x, w, 0, 0, 0, 128) }, "N=0"},
		{"x unaligned", func() error { return k.GemvFP8Bulk(0, y, x+4, w, 0, 0, 64, 128) }, "16-byte aligned x"},
		{"w unaligned", func() error { return k.GemvFP8Bulk(0, y, x, w+8, 0, 0, 64, 128) }, "not 16-byte aligned"},
		{"no w", func() error { return k.GemvFP8Bulk(0, y, x, 0, 0, 0, 64, 128) }, "no weights"},
		{"no y", func() error { return k.GemvFP8Bulk(0, 0, x, w, 0, 0, 64, 128) }, "y must be given"},
		{"no up", func() error { return k.GateUpFP8Bulk(0, y, x, w, 0, 0, 0, 64, 128) }, "both weights"},
		{"M = 2", func() error {
			return k.bulk(0, tileLaunch{w0: w, dense: 1, x: x, ldx: 128, y: y, ldy: 64, N: 64, K: 128, M: 2})
		}, "one input row"},
		{"no tables", func() error {
			return k.ExpertsFP8Bulk(0, y, x, 128, 1, 0, [2]cuda.DevPtr{}, [2]cuda.DevPtr{}, 0, 4, [2]cuda.DevPtr{}, [2]cuda.DevPtr{}, 0, 64, 128, 0)
		}, "need tables"},
		{"pairing", func() error {
			return k.ExpertsFP8Bulk(0, y, x, 128, 1, 0, [2]cuda.DevPtr{w, w}, [2]cuda.DevPtr{}, w, 4, [2]cuda.DevPtr{w}, [2]cuda.DevPtr{}, 1, 64, 128, 0)
		}, "pairing"},
		{"ldx < K", func() error {
			return k.ExpertsFP8Bulk(0, y, x, 64, 1, 0, [2]cuda.DevPtr{w}, [2]cuda.DevPtr{}, w, 4, [2]cuda.DevPtr{}, [2]cuda.DevPtr{}, 0, 64, 128, 0)
		}, "ldx=64"},
	} {
		err := c.f()
		if err == nil || !strings.Contains(fmt.Sprintf("%+v", err), c.want) {
			t.Errorf("%s: %v, want an error with %q", c.name, err, c.want)
		}
	}
}

// TestBulkLayout pins the launcher's arithmetic: a stage is 16 KiB for
// every group size (256/G groups x 4 rows x 16 G bytes), the ring fits two
// blocks (or one) per SM of an H200 (228 KiB, 1 KiB reserved a block), and
// the persistent grid gives every block the same number of tiles.
func TestBulkLayout(t *testing.T) {
	for _, G := range []int{32, 64, 128, 256} {
		if b := (256 / G) * gemvBulkRG * 16 * G; b != gemvBulkStage {
			t.Errorf("G=%d: stage %d bytes", G, b)
		}
	}
	for _, B := range []int{1, 2} {
		if sm := bulkSmem(bulkStages(B)); B*(sm+1024) > 228<<10 || sm > 227<<10 {
			t.Errorf("B=%d: %d bytes a block", B, sm)
		}
	}
	for _, c := range []struct{ tiles, B, sms, grid int }{
		{448, 2, 132, 224}, {1536, 2, 132, 256}, {2304, 2, 132, 256}, {4032, 2, 132, 252}, {3, 2, 132, 3}, {264, 2, 132, 264}, {265, 1, 132, 89},
	} {
		if g := bulkGrid(c.tiles, c.B, c.sms); g != c.grid {
			t.Errorf("bulkGrid(%d, %d, %d) = %d, want %d", c.tiles, c.B, c.sms, g, c.grid)
		}
		g := bulkGrid(c.tiles, c.B, c.sms)
		if per := cdiv(c.tiles, g); g > c.B*c.sms || (per-1)*g >= c.tiles {
			t.Errorf("tiles %d grid %d: uneven", c.tiles, g)
		}
	}
	// The decode shapes: o_proj, q_b, 9 gate-up slots, 9 down slots (132 SMs).
	for _, c := range []struct {
		N, K, slots int
		pair        bool
		G, tiles    int
	}{{7168, 16384, 1, false, 64, 448}, {24576, 1536, 1, false, 64, 1536}, {2048, 7168, 9, true, 64, 2304}, {7168, 2048, 9, false, 64, 4032}} {
		G := bulkG(132, c.N, c.K, c.slots, c.pair)
		if G != c.G || bulkTiles(c.N, G, c.slots, c.pair) != c.tiles {
			t.Errorf("N=%d K=%d slots=%d: G=%d tiles=%d, want %d %d", c.N, c.K, c.slots, G, bulkTiles(c.N, G, c.slots, c.pair), c.G, c.tiles)
		}
	}
}

// needBulkCheck: the bulk GEMV's GPU tests are opt-in until the kernel has
// run on a GPU (TILERT_GPU_BULK_CHECK=1, set by docs/measured/next5/gbulk.sh):
// an unmeasured opt-in kernel whose pipeline could deadlock must not hang
// make gpu-check for the default paths. Called on the test goroutine.
func needBulkCheck(t *testing.T) {
	t.Helper()
	if os.Getenv("TILERT_GPU_BULK_CHECK") != "1" {
		t.Skip("opt-in until the bulk GEMV has run on a GPU: TILERT_GPU_BULK_CHECK=1 (docs/measured/next5/gbulk.sh)")
	}
}
