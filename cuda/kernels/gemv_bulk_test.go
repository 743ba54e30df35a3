package kernels

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/tilert-go/tilert/cuda"
)

// bulkShapes: o_proj of both models (7168 / 6144 x 16384), DeepSeek-V3.2
// dims' q_b and indexer wq_b (24576 / 8192 x 1536, G 32 only: 1536 is not a
// multiple of 1024), an expert-sized 2048 x 7168, a shape whose last round
// leaves most groups idle (520 x 2048) and one tile (8 x 1024), each with
// the G its bits are to match.
var bulkShapes = []struct{ N, K, G int }{
	{7168, 16384, 64}, {6144, 16384, 64}, {24576, 1536, 32}, {8192, 1536, 32},
	{2048, 7168, 64}, {2048, 7168, 32}, {520, 2048, 64}, {8, 1024, 64},
}

// TestNVRTCBulkCompiles: the bulk-copy GEMV compiles for sm_90 (no GPU
// needed) without spills, within 128 registers (one block of 256 an SM
// leaves half the register file to the kernels beside it).
func TestNVRTCBulkCompiles(t *testing.T) {
	log, version := ptxasLogSM90(t, moduleSource(kernelFS, "cu/gemv_bulk.cu", defaultHeaders...), "gemv_bulk.cu")
	lims := []regLimit{{bulkKernel(32), 128}, {bulkKernel(64), 128}}
	checkRegisters(t, log, version, lims)
	sp, _ := ptxasSpills(log)
	for _, l := range lims {
		if sp[l.name] != "" {
			t.Errorf("%s spills %s bytes (NVRTC %s)", l.name, sp[l.name], version)
		}
	}
}

func TestBulkPlans(t *testing.T) {
	for _, s := range []string{"G32/R8_bk/B0", "G64/R8_bk/B0"} {
		if p, err := ParseTilePlan(s); err != nil || p.V != BulkVariant {
			t.Errorf("ParseTilePlan(%q) = %v, %v", s, p, err)
		}
	}
	for _, s := range []string{"G128/R8_bk/B0", "G64/R4_bk/B0", "G64/R8_bk/B2"} {
		if p, err := ParseTilePlan(s); err == nil {
			t.Errorf("ParseTilePlan(%q) = %v: want an error (the bulk kernel is G32|G64/R8/B0)", s, p)
		}
	}
	for _, c := range []struct {
		N, K, G int
		ok      bool
	}{
		{7168, 16384, 64, true}, {24576, 1536, 32, true}, {24576, 1536, 64, false}, {12, 1024, 64, false},
		{8, 1000, 32, false}, {0, 1024, 64, false}, {8, 1024, 128, false},
	} {
		if got := bulkShapeOK(c.N, c.K, c.G); got != c.ok {
			t.Errorf("bulkShapeOK(%d, %d, %d) = %v, want %v", c.N, c.K, c.G, got, c.ok)
		}
	}
}

// TestKernelGemvBulk: the bulk-copy GEMV against the tile kernels of the
// same G (bit for bit: the same sums) and the CPU reference, with and
// without a residual, on fresh random inputs; then launched
// programmatically behind the kernel that writes its x, eagerly and in
// graph replays (its stages are issued before the wait).
func TestKernelGemvBulk(t *testing.T) {
	onGPU(t, func(c *cuda.Ctx, k *Set, a *allocs, r *rand.Rand) {
		if c.Info().CCMajor < 9 {
			t.Skip("the bulk-copy GEMV needs sm_90")
		}
		s := c.Stream()
		for _, sh := range bulkShapes {
			N, K, G := sh.N, sh.K, sh.G
			w := randFP8(r, N*K)
			sc := randScales(r, cdiv(N, 128)*cdiv(K, 128), -8)
			x := randF32(r, K, 1)
			res := randF32(r, N, 1)
			wp, sp, xp, rp := a.up(w), a.up(sc), a.up(x), a.up(res)
			run := func(p TilePlan, resid cuda.DevPtr) []float32 {
				prev := k.SetTilePlan(N, K, p)
				defer k.SetTilePlan(N, K, prev)
				y := a.poisoned(N)
				chk(k.GemvFP8Tile(s, y, xp, wp, sp, resid, N, K, 1, K, N))
				return downF32(c, y, N)
			}
			for _, withResid := range []bool{false, true} {
				var rr cuda.DevPtr
				var rv []float32
				if withResid {
					rr, rv = rp, res
				}
				tile := run(mustPlan(fmt.Sprintf("G%d/R8/B0", G)), rr)
				n0 := BulkLaunches.Load()
				got := run(mustPlan(fmt.Sprintf("G%d/R8_bk/B0", G)), rr)
				name := fmt.Sprintf("gemv_bulk %dx%d G%d resid %v", N, K, G, withResid)
				if n := BulkLaunches.Load() - n0; n != 1 {
					t.Errorf("%s: %d bulk launches, want 1 (fell back to the tile kernel)", name, n)
				}
				record(t, name+" == tile", "differing outputs", float64(diffCount(got, tile)), 0)
				record(t, name, relMetric, relErr(got, refGemv(fp8At(w, sc, K), x, rv, N, K, 1, K, N)), boundF32)
			}
		}
		// Programmatic, behind a writer of x (a 16384 x 7168 GEMV whose
		// output is o_proj's input).
		const N, K, KW = 7168, 16384, 7168
		w := randFP8(r, N*K)
		sc := randScales(r, cdiv(N, 128)*cdiv(K, 128), -8)
		ww := randFP8(r, K*KW)
		sw := randScales(r, cdiv(K, 128)*cdiv(KW, 128), -8)
		wp, sp, wwp, swp := a.up(w), a.up(sc), a.up(ww), a.up(sw)
		prev := k.SetTilePlan(N, K, mustPlan("G64/R8_bk/B0"))
		defer k.SetTilePlan(N, K, prev)
		k.SetPDL(true)
		defer k.SetPDL(false)
		if !k.programmatic(bulkKernel(64)) {
			t.Logf("no programmatic launches on this device: the chain runs plainly")
		}
		xp := a.poisoned(K)
		y := a.poisoned(N)
		in := a.raw(int64(4 * KW))
		chain := func() {
			chk(k.GemvFP8Tile(s, xp, in, wwp, swp, 0, K, KW, 1, KW, K))
			chk(k.GemvFP8Tile(s, y, xp, wp, sp, 0, N, K, 1, K, N))
		}
		check := func(what string, xin []float32) {
			xd := downF32(c, xp, K)
			record(t, what+": writer's x", relMetric, relErr(xd, refGemv(fp8At(ww, sw, KW), xin, nil, K, KW, 1, KW, K)), boundF32)
			record(t, what, relMetric, relErr(downF32(c, y, N), refGemv(fp8At(w, sc, K), xd, nil, N, K, 1, K, N)), boundF32)
		}
		for i := range 2 {
			xin := randF32(r, KW, 1)
			chk(c.CopyHtoDAsync(in, f32Bytes(xin), s))
			chk(c.MemsetD8(y, 0xff, int64(4*N), s))
			chk(c.MemsetD8(xp, 0xff, int64(4*K), s))
			chain()
			chk(c.SyncStream(s))
			check(fmt.Sprintf("bulk, programmatic, eager %d", i), xin)
		}
		chk(c.BeginCapture(s))
		chain()
		g, err := c.EndCaptureWith(s, true)
		chk(err)
		defer func() { chk(c.DestroyGraph(g)) }()
		for i := range 3 {
			xin := randF32(r, KW, 1)
			chk(c.CopyHtoDAsync(in, f32Bytes(xin), s))
			chk(c.MemsetD8(xp, 0xff, int64(4*K), s))
			chk(c.LaunchGraph(g, s))
			chk(c.SyncStream(s))
			check(fmt.Sprintf("bulk, programmatic, graph replay %d", i), xin)
		}
	})
}

// TestKernelTimingBulk: the bulk-copy GEMV against today's plan and the
// dealt-out _d16s plan of the same G on the shapes it takes, graph-timed
// over cold weight copies, next to a device-to-device copy
// (TILERT_GPU_TIMING=1; never asserted).
func TestKernelTimingBulk(t *testing.T) {
	needTiming(t)
	onGPU(t, func(c *cuda.Ctx, k *Set, a *allocs, r *rand.Rand) {
		if c.Info().CCMajor < 9 {
			t.Skip("the bulk-copy GEMV needs sm_90")
		}
		s := c.Stream()
		sms := c.Info().SMs
		add := timingTable(t, c, a, r, 1<<30, "bulk: device-to-device copy 1 GiB (read+write)", "reference")
		for _, sh := range [][3]int{{7168, 16384, 64}, {6144, 16384, 64}, {24576, 1536, 32}, {8192, 1536, 32}, {2048, 7168, 64}} {
			N, K, G := sh[0], sh[1], sh[2]
			nc := coldCopies(int64(N * K))
			ws, ss := devFP8s(c, a, r, nc, N, K)
			x := a.up(randF32(r, K, 1))
			y := a.raw(int64(4 * N))
			bytes := float64(N*K + 4*cdiv(N, 128)*cdiv(K, 128) + 4*(K+N))
			for _, ps := range []string{"", fmt.Sprintf("G%d/R8_d16s/B0", G), fmt.Sprintf("G%d/R8_bk/B0", G)} {
				p := TilePlan{}
				if ps != "" {
					p = mustPlan(ps)
				}
				prev := k.SetTilePlan(N, K, p)
				us := graphUsRot(c, s, 2*nc, 11, func(i int) {
					chk(k.GemvFP8Tile(s, y, x, ws[i%nc], ss[i%nc], 0, N, K, 1, K, N))
				})
				k.SetTilePlan(N, K, prev)
				name := ps
				if name == "" {
					name = "today " + defaultPlan(sms, N, K).String()
				}
				add(fmtName("bulk: %dx%d %s", N, K, name), bytes, us, "")
			}
		}
	})
}
