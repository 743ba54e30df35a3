package kernels

import (
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"testing"

	"github.com/tilert-go/tilert/cuda"
)

// TestKernelPDLEarlyChain (device): PDL mode 2 (TILERT_GPU_PDL=2, the
// TILERT_PDL_EARLY module: short kernels trigger before their wait, the
// weight-streaming GEMVs load their first weights before it and trigger
// after their last weight loads) changes no bit. A layer-like chain
// (rmsnorm -> staged-norm grouped GEMV -> the same with the loop norm
// prologue -> grouped GEMV -> tile GEMV with a
// residual -> rmsnorm -> router GEMV -> moe_route -> paired gate/up over
// routed slots and the shared expert -> down -> combine, with add_rmsnorm
// at the end) runs with the default module's kernels launched plainly, and
// with the early module's launched programmatically, eagerly and as a
// graph replayed three times; every intermediate buffer is poisoned with
// NaN before each run, and each must come out word for word the plain
// run's. M = 1 runs the whole chain, M = 2 and 4 the part before the
// experts (which take one row with routed slots).
func TestKernelPDLEarlyChain(t *testing.T) {
	onGPU(t, func(c *cuda.Ctx, k *Set, a *allocs, r *rand.Rand) {
		ke, err := LoadEarly(c)
		chk(err)
		t.Logf("reference Set: mode %d; early Set: mode %d, programmatic launches %v (device supports them: %v)",
			k.PDLMode(), ke.PDLMode(), ke.PDL(), c.PDLSupported())
		if ke.PDLMode() != 2 {
			t.Fatalf("LoadEarly's Set is in mode %d", ke.PDLMode())
		}
		s, err := c.NewStream()
		chk(err)
		defer c.DestroyStream(s)
		const H, QA, KV, IW, QB, E, top, I = 2048, 384, 192, 64, 1024, 16, 4, 512
		fp8 := func(N, K int) (cuda.DevPtr, cuda.DevPtr) {
			return a.up(randFP8(r, N*K)), a.up(randScales(r, cdiv(N, 128)*cdiv(K, 128), -7))
		}
		nw1, nw2, nw3 := a.up(randF32(r, H, 1)), a.up(randF32(r, H, 1)), a.up(randF32(r, H, 1))
		wqa, sqa := fp8(QA, H)
		wkv, skv := fp8(KV, H)
		wiw := a.up(randBF16(r, IW*H, 0.05))
		wqb, sqb := fp8(QB, QA)
		wq2, sq2 := fp8(256, QA)
		wo, so := fp8(H, QB)
		wr := a.up(randBF16(r, E*H, 0.05))
		bias := a.up(randF32(r, E, 0.1))
		var tabW, tabS, shW, shS [3]cuda.DevPtr
		dims := [3][2]int{{I, H}, {I, H}, {H, I}}
		for p := range 3 {
			ex := randFP8Experts(r, a, E+1, dims[p][0], dims[p][1])
			tabW[p], tabS[p] = a.up(ex.wp[:E]), a.up(ex.sp[:E])
			shW[p], shS[p] = ex.wp[E], ex.sp[E]
		}
		run := func(M int, tag string) {
			h0 := a.up(randF32(r, M*H, 1))
			type buf struct {
				name string
				p    cuda.DevPtr
				n    int
			}
			var bufs []buf
			nb := func(name string, n int) cuda.DevPtr {
				p := a.raw(int64(4 * n))
				bufs = append(bufs, buf{name, p, n})
				return p
			}
			xn := nb("rmsnorm", M*H)
			yqa, ykv, yiw := nb("group_sn q_a", M*QA), nb("group_sn kv_a", M*KV), nb("group_sn bf16", M*IW)
			yqa2 := nb("group (loop-norm prologue) q_a", M*QA)
			yqb, yq2 := nb("group q_b", M*QB), nb("group wq_b", M*256)
			yo := nb("tile o_proj+resid", M*H)
			xn2 := nb("rmsnorm 2", M*H)
			moe := M == 1
			var lg, ids, wts, gu, yd, out, hres, xn3 cuda.DevPtr
			if moe {
				lg, ids, wts = nb("router logits", E), nb("moe_route ids", top), nb("moe_route weights", top)
				gu, yd = nb("experts gate/up", (top+1)*I), nb("experts down", (top+1)*H)
				out = nb("moe_combine_slots", H)
				hres, xn3 = nb("add_rmsnorm resid", H), nb("add_rmsnorm", H)
			}
			chain := func(k *Set) {
				chk(k.RMSNorm(s, xn, h0, nw1, M, H, H, H, 1e-6))
				chk(k.GemvGroup(s, h0, H, M, H, []GroupSeg{
					{W: wqa, S: sqa, Y: yqa, N: QA, LdY: QA}, {W: wkv, S: skv, Y: ykv, N: KV, LdY: KV},
					{W: wiw, Y: yiw, N: IW, LdY: IW, BF16: true}}, GroupNorm{W: nw1, Eps: 1e-6, Staged: true}))
				chk(k.GemvGroup(s, h0, H, M, H, []GroupSeg{{W: wqa, S: sqa, Y: yqa2, N: QA, LdY: QA}}, GroupNorm{W: nw1, Eps: 1e-6}))
				chk(k.GemvGroup(s, yqa, QA, M, QA, []GroupSeg{
					{W: wqb, S: sqb, Y: yqb, N: QB, LdY: QB}, {W: wq2, S: sq2, Y: yq2, N: 256, LdY: 256}}, GroupNorm{}))
				chk(k.GemvFP8Tile(s, yo, yqb, wo, so, h0, H, QB, M, QB, H))
				chk(k.RMSNorm(s, xn2, yo, nw2, M, H, H, H, 1e-6))
				if !moe {
					return
				}
				chk(k.GemvBF16Wide(s, lg, xn2, wr, 0, E, H, 1, H, E))
				chk(k.MoERoute(s, ids, wts, lg, bias, 1, E, top, 1, 1, true, 2.5))
				chk(k.ExpertsFP8(s, gu, xn2, H, top, 0, [2]cuda.DevPtr{tabW[0], tabW[1]}, [2]cuda.DevPtr{tabS[0], tabS[1]}, ids, top,
					[2]cuda.DevPtr{shW[0], shW[1]}, [2]cuda.DevPtr{shS[0], shS[1]}, 1, I, H))
				chk(k.ExpertsFP8(s, yd, gu, I, 1, top, [2]cuda.DevPtr{tabW[2]}, [2]cuda.DevPtr{tabS[2]}, ids, top,
					[2]cuda.DevPtr{shW[2]}, [2]cuda.DevPtr{shS[2]}, 1, H, I))
				chk(k.MoECombineSlots(s, out, yd, wts, yd.Add(int64(4*top*H)), 1, top, H))
				chk(c.CopyDtoD(hres, yo, int64(4*H), s))
				chk(k.AddRMSNorm(s, xn3, hres, out, nw3, 1, H, H, H, H, 1e-6))
			}
			poison := func() {
				for _, b := range bufs {
					chk(c.MemsetD32(b.p, 0x7fc00000, int64(b.n), s))
				}
			}
			read := func() [][]float32 {
				chk(c.SyncStream(s))
				out := make([][]float32, len(bufs))
				for i, b := range bufs {
					out[i] = downF32(c, b.p, b.n)
				}
				return out
			}
			prev := k.PDL()
			k.SetPDL(false)
			poison()
			chain(k)
			want := read()
			k.SetPDL(prev)
			compare := func(how string, got [][]float32) {
				for i, b := range bufs {
					diff, nan := 0, 0
					for j := range got[i] {
						if math.Float32bits(got[i][j]) != math.Float32bits(want[i][j]) {
							diff++
						}
						if math.IsNaN(float64(want[i][j])) {
							nan++
						}
					}
					if nan > 0 {
						t.Errorf("M=%d %s: the plain run left %d NaN words (poison not overwritten)", M, b.name, nan)
					}
					record(t, fmt.Sprintf("pdl2 chain M=%d%s %s: %s", M, tag, how, b.name), "differing words", float64(diff), 0)
				}
			}
			poison()
			chain(ke)
			compare("early module, eager", read())
			chk(c.BeginCapture(s))
			chain(ke)
			g, err := c.EndCapture(s)
			chk(err)
			for rep := range 3 {
				poison()
				chk(c.LaunchGraph(g, s))
				compare(fmt.Sprintf("early module, graph replay %d", rep+1), read())
			}
			chk(c.DestroyGraph(g))
		}
		for _, M := range []int{1, 2, 4} {
			run(M, "")
		}
		// The tile kernels' other shapes at one row: 16 loads in flight, 4
		// blocks an SM, and grids capped so a block of the default module
		// takes several row tiles in turn (the early module never caps:
		// one tile a block; a row's sums are the same either way).
		defer func(r int) { TileRule = r }(TileRule)
		defer func() { forceTileG, forceTileR, forceTileV, forceTileB = 0, 0, "", 0 }()
		for _, cf := range []struct {
			G, R int
			v    string
			B    int
		}{{64, 8, "_d16", 0}, {64, 8, "_o4", -2}, {128, 2, "_d16", -3}, {64, 4, "-", -2}} {
			TileRule = 3
			forceTileG, forceTileR, forceTileV, forceTileB = cf.G, cf.R, cf.v, cf.B
			run(1, fmt.Sprintf(" G=%d R=%d%s B=%d", cf.G, cf.R, cf.v, cf.B))
		}
	})
}

// TestKernelPDLModeEnv (device): Load's Set is in the mode TILERT_GPU_PDL
// names (2: the TILERT_PDL_EARLY module), so engine runs with the switch
// set do run mode 2 (where the device launches programmatically).
func TestKernelPDLModeEnv(t *testing.T) {
	onGPU(t, func(c *cuda.Ctx, k *Set, a *allocs, r *rand.Rand) {
		want := pdlMode()
		if !c.PDLSupported() {
			want = 0
		}
		t.Logf("TILERT_GPU_PDL=%q: Set mode %d, programmatic %v", os.Getenv("TILERT_GPU_PDL"), k.PDLMode(), k.PDL())
		if k.PDLMode() != want || k.PDL() != (want != 0) {
			t.Errorf("TILERT_GPU_PDL=%q: Set mode %d (programmatic %v), want %d", os.Getenv("TILERT_GPU_PDL"), k.PDLMode(), k.PDL(), want)
		}
		record(t, fmt.Sprintf("pdl mode from TILERT_GPU_PDL=%q (want %d)", os.Getenv("TILERT_GPU_PDL"), want), "|mode - want|", math.Abs(float64(k.PDLMode()-want)), 0)
	})
}
