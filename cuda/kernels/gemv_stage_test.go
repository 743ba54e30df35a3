package kernels

import (
	"fmt"
	"math/rand/v2"
	"regexp"
	"strings"
	"testing"

	"github.com/tilert-go/tilert/cuda"
)

// stageShapes: the indexer wq_b of both models (DeepSeek-V3.2 8192 x 1536,
// GLM-5 4096 x 2048), their q_b (24576 x 1536, 16384 x 2048: grids of more
// blocks than the SMs hold), small and odd-block shapes, one with 8-row
// blocks.
var stageShapes = [][2]int{{8192, 1536}, {4096, 2048}, {24576, 1536}, {16384, 2048}, {512, 512}, {128, 1024}, {64, 3072}, {8, 512}}

func TestStageRows(t *testing.T) {
	for _, c := range []struct {
		N, K, sms, smem int
		rb              int // 0: does not fit
	}{
		{8192, 1536, 132, 232448, 64},  // DeepSeek-V3.2 wq_b: 128 blocks of 96 KB
		{4096, 2048, 132, 232448, 32},  // GLM-5 wq_b: 128 blocks of 64 KB
		{8192, 1536, 114, 232448, 64},  // H100 PCIe's SMs
		{24576, 1536, 132, 232448, 64}, // DeepSeek-V3.2 q_b: 384 blocks of 96 KB, two an SM
		{16384, 2048, 132, 232448, 32}, // GLM-5 q_b: 64 rows would be 128 KB blocks, one an SM
		{1024, 8192, 132, 232448, 8},   // 128 blocks of 64 KB at 8 rows: the fewest the SMs take
		{4096, 4096, 132, 232448, 16},  // 32 rows: 128 KB, one an SM
		{512, 512, 132, 232448, 8},
		{8, 512, 132, 232448, 8},
		{12, 512, 132, 232448, 0},    // not a whole number of 8-row blocks
		{8192, 1000, 132, 232448, 0}, // K not a multiple of 512
		{7168, 16384, 132, 232448, 0},
		{8192, 1536, 132, 64 * 1024, 0}, // 96 KB blocks past the opt-in
		{0, 512, 132, 232448, 0},
	} {
		rb, ok := stageRows(c.N, c.K, stageSM{sms: c.sms, maxSmem: c.smem, smemSM: 233472, reserved: 1024})
		if (c.rb == 0) != !ok || (ok && rb != c.rb) {
			t.Errorf("stageRows(%d, %d, %d SMs, %d B) = %d, %v; want %d", c.N, c.K, c.sms, c.smem, rb, ok, c.rb)
		}
		if ok && (c.N%rb != 0 || 128%rb != 0 || stageSmem(rb, c.K) > c.smem) {
			t.Errorf("stageRows(%d, %d) = %d: breaks the kernel's contract", c.N, c.K, rb)
		}
	}
	p, err := ParseTilePlan("G32/R8_st/B0")
	if err != nil || p.V != StageVariant {
		t.Fatalf("ParseTilePlan(G32/R8_st/B0) = %v, %v", p, err)
	}
	for _, s := range []string{"G64/R8_st/B0", "G32/R4_st/B0", "G32/R8_st/B1"} {
		if p, err := ParseTilePlan(s); err == nil {
			t.Errorf("ParseTilePlan(%q) = %v: want an error (the staged kernel is G32/R8/B0 only)", s, p)
		}
	}
}

// TestNVRTCStageRegisters: the staged GEMV compiles for sm_90 within 64
// registers (no GPU needed), so a block of it (16K registers) fits beside
// two of the layer-input grouped GEMV's blocks (<= 80 registers each,
// TestNVRTCQANormLateKernels), where it is to copy its weights while they
// run.
func TestNVRTCStageRegisters(t *testing.T) {
	log, version := ptxasLogSM90(t, moduleSource(kernelFS, "cu/gemv_stage.cu", defaultHeaders...), "gemv_stage.cu")
	checkRegisters(t, log, version, []regLimit{{stageKernel, 64}})
	if sp, _ := ptxasSpills(log); sp[stageKernel] != "" {
		t.Errorf("%s spills %s bytes (NVRTC %s)", stageKernel, sp[stageKernel], version)
	}
}

// TestPDLWeightsFirst: every kernel on pdlWeightsFirst begins with the
// weight copy, handed only the kernel's weight pointers and K, then
// PDL_WAIT(); the copy helper takes nothing else, so before the wait the
// kernel reads no pointer the step writes. Fails for a synthetic kernel
// that reads x first.
func TestPDLWeightsFirst(t *testing.T) {
	src := stripComments(KernelSource())
	check := func(src, name string) error {
		defs := kernelEntries(src)[name]
		if len(defs) == 0 {
			return fmt.Errorf("no kernel %s in the source", name)
		}
		body, err := kernelBody(src, name)
		if err != nil {
			return err
		}
		st := strings.SplitN(body, ";", 3)
		if len(st) < 3 || strings.Join(strings.Fields(st[0]), "") != "gemv_stage_issue(W,S,K)" ||
			strings.Join(strings.Fields(st[1]), "") != "PDL_WAIT()" {
			return fmt.Errorf("%s does not begin gemv_stage_issue(W, S, K); PDL_WAIT();", name)
		}
		return nil
	}
	for n := range pdlWeightsFirst {
		if err := check(src, n); err != nil {
			t.Error(err)
		}
		if pdlKernels[n] || pdlMoreKernels[n] {
			t.Errorf("%s is on pdlWeightsFirst and another list", n)
		}
	}
	sig := regexp.MustCompile(`void\s+gemv_stage_issue\(([^)]*)\)`).FindStringSubmatch(src)
	if sig == nil || strings.Join(strings.Fields(sig[1]), " ") != "const void* __restrict__ W, const float* __restrict__ S, int K" {
		t.Errorf("gemv_stage_issue's parameters %q: it must take the weights, their scales and K only", sig)
	}
	bad := `extern "C" __global__ void k(const float* x, float* y) { y[0] = x[0]; PDL_WAIT(); }`
	if err := check(bad, "k"); err == nil {
		t.Error("a kernel reading x before its wait passed the check")
	}
}

// kernelBody is the text between the braces of name's (first) definition.
func kernelBody(src, name string) (string, error) {
	re := regexp.MustCompile(`__global__[^{;]*\b` + name + `\s*\(`)
	loc := re.FindStringIndex(src)
	if loc == nil {
		return "", fmt.Errorf("no definition of %s", name)
	}
	q := matchParen(src, loc[1]-1)
	if q < 0 {
		return "", fmt.Errorf("%s: unbalanced parameters", name)
	}
	b := strings.IndexByte(src[q:], '{')
	if b < 0 {
		return "", fmt.Errorf("%s: no body", name)
	}
	open := q + b
	depth := 0
	for i := open; i < len(src); i++ {
		switch src[i] {
		case '{':
			depth++
		case '}':
			depth--
			if depth == 0 {
				return src[open+1 : i], nil
			}
		}
	}
	return "", fmt.Errorf("%s: unbalanced body", name)
}

// TestKernelGemvStage: the staged GEMV on fresh weights, scales and x is bit
// for bit the tile kernel's G32/R8 plan (the same sums) and within float32
// of the float64 reference, with and without resid; then programmatically,
// eager and in a replayed graph, right behind a long GEMV that writes its x
// (poisoned first): a read of x before the wait would see the poison or
// the previous replay's x.
func TestKernelGemvStage(t *testing.T) {
	onGPU(t, func(c *cuda.Ctx, k *Set, a *allocs, r *rand.Rand) {
		s := c.Stream()
		for _, sh := range stageShapes {
			N, K := sh[0], sh[1]
			if !k.StageFits(N, K) {
				t.Errorf("%dx%d: the staged GEMV does not fit this device (%d SMs, %d B shared)", N, K, c.Info().SMs, c.Info().MaxSharedOptin)
				continue
			}
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
				tile := run(mustPlan("G32/R8/B0"), rr)
				n0 := StageLaunches.Load()
				got := run(mustPlan("G32/R8_st/B0"), rr)
				name := fmt.Sprintf("gemv_stage %dx%d resid %v", N, K, withResid)
				if n := StageLaunches.Load() - n0; n != 1 {
					t.Errorf("%s: %d staged launches, want 1 (fell back to the tile kernel)", name, n)
				}
				record(t, name+" == tile G32/R8", "differing outputs", float64(diffCount(got, tile)), 0)
				record(t, name, relMetric, relErr(got, refGemv(fp8At(w, sc, K), x, rv, N, K, 1, K, N)), boundF32)
			}
		}
		// Programmatic, behind a writer of x: a 1536 x 16384 fp8 GEMV
		// (~25 MB, some microseconds) whose output is the staged GEMV's x.
		const N, K, KW = 8192, 1536, 16384
		w := randFP8(r, N*K)
		sc := randScales(r, cdiv(N, 128)*cdiv(K, 128), -8)
		ww := randFP8(r, K*KW)
		sw := randScales(r, cdiv(K, 128)*cdiv(KW, 128), -8)
		wp, sp, wwp, swp := a.up(w), a.up(sc), a.up(ww), a.up(sw)
		prev := k.SetTilePlan(N, K, mustPlan("G32/R8_st/B0"))
		defer k.SetTilePlan(N, K, prev)
		k.SetPDL(true)
		defer k.SetPDL(false)
		if !k.programmatic(stageKernel) {
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
			xs := refGemv(fp8At(ww, sw, KW), xin, nil, K, KW, 1, KW, K)
			// The staged GEMV's input is the writer's float32 output: take
			// it back from the device, so the reference sees the same x.
			xd := downF32(c, xp, K)
			record(t, what+": writer's x", relMetric, relErr(xd, xs), boundF32)
			got := downF32(c, y, N)
			record(t, what, relMetric, relErr(got, refGemv(fp8At(w, sc, K), xd, nil, N, K, 1, K, N)), boundF32)
		}
		for i := range 2 {
			xin := randF32(r, KW, 1)
			chk(c.CopyHtoDAsync(in, f32Bytes(xin), s))
			chk(c.MemsetD8(y, 0xff, int64(4*N), s))
			chk(c.MemsetD8(xp, 0xff, int64(4*K), s))
			chain()
			chk(c.SyncStream(s))
			check(fmt.Sprintf("programmatic, eager %d", i), xin)
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
			check(fmt.Sprintf("programmatic, graph replay %d", i), xin)
		}
	})
}
