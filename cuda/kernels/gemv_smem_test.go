package kernels

import (
	"fmt"
	"math/rand/v2"
	"regexp"
	"strings"
	"testing"

	"github.com/tilert-go/tilert/cuda"
)

// Checks of the on-chip bf16 GEMV (cu/gemv_wide.cu gemv_bf16_smem_r*,
// GemvBF16Smem): its plan, that nothing but weights is read before its
// PDL wait, that it compiles without spills, and on the GPU its outputs
// against the float64 reference, directly and in a graph right after the
// kernel that writes its x (programmatic launches), plus its timing
// against gemv_bf16_wide at the routers' shapes.

// H200: 132 SMs, 227 KB of opt-in shared memory a block.
const (
	h200SMs       = 132
	h200MaxShared = 232448
)

func TestGemvSmemPlan(t *testing.T) {
	for _, c := range []struct {
		name          string
		N, K, M       int
		r, smem       int
		ok            bool
		sms, maxShare int
	}{
		// J = ceil(K/8/256) trips; smem = J (R + 2M) 256 16 bytes.
		{"DeepSeek-V3.2 router", 256, 7168, 1, 2, 4 * 4 * 4096, true, 0, 0},
		{"DeepSeek-V3.2 router 4 rows", 256, 7168, 4, 2, 4 * 10 * 4096, true, 0, 0},
		{"GLM-5 router", 256, 6144, 1, 2, 3 * 4 * 4096, true, 0, 0},
		{"GLM-5 router 4 rows", 256, 6144, 4, 2, 3 * 10 * 4096, true, 0, 0},
		{"one row a block", 132, 7168, 1, 1, 4 * 3 * 4096, true, 0, 0},
		{"four rows a block", 133 * 2, 2048, 2, 4, 1 * 8 * 4096, true, 0, 0},
		{"tiny preset", 16, 160, 1, 1, 1 * 3 * 4096, true, 0, 0},
		{"too many rows", 4*132 + 1, 7168, 1, 0, 0, false, 0, 0},
		{"rows and x past shared memory", 256, 16384, 4, 0, 0, false, 0, 0},
		{"long rows at one row fit", 256, 16384, 1, 2, 8 * 4 * 4096, true, 0, 0},
		{"K not whole chunks", 256, 7164, 1, 0, 0, false, 0, 0},
		{"M past the GEMV limit", 256, 7168, 5, 0, 0, false, 0, 0},
		{"no rows", 0, 7168, 1, 0, 0, false, 0, 0},
		{"an A100's 108 SMs", 256, 7168, 1, 4, 4 * 6 * 4096, true, 108, 166912},
		{"48 KB blocks", 256, 7168, 1, 0, 0, false, 0, 48 << 10},
	} {
		sms, share := h200SMs, h200MaxShared
		if c.sms > 0 {
			sms = c.sms
		}
		if c.maxShare > 0 {
			share = c.maxShare
		}
		r, smem, ok := gemvSmemPlan(sms, share, c.N, c.K, c.M)
		if ok != c.ok || ok && (r != c.r || smem != c.smem) {
			t.Errorf("%s (N=%d K=%d M=%d): r=%d smem=%d ok=%v, want r=%d smem=%d ok=%v", c.name, c.N, c.K, c.M, r, smem, ok, c.r, c.smem, c.ok)
		}
		if ok && smem+gemvSmemStatic > share {
			t.Errorf("%s: %d + %d bytes past the %d a block may use", c.name, smem, gemvSmemStatic, share)
		}
	}
}

// weightsFirstProblems lists what is wrong with the kernels names of src
// (CUDA C, comments stripped) as pdlWeightsFirst kernels: each body must
// be one call of the staging helper on (W, N, K), then PDL_WAIT(), and the
// helper must take nothing but the weights and their shape, so that it
// cannot read what the step writes.
func weightsFirstProblems(src string, names []string) []string {
	var out []string
	body := func(open int) (string, bool) {
		d := 0
		for i := open; i < len(src); i++ {
			switch src[i] {
			case '{':
				d++
			case '}':
				d--
				if d == 0 {
					return src[open+1 : i], true
				}
			}
		}
		return "", false
	}
	squeeze := func(s string) string { return strings.Join(strings.Fields(s), "") }
	for _, n := range names {
		loc := regexp.MustCompile(`__global__[^;{]*\b` + n + `\s*\(`).FindStringIndex(src)
		if loc == nil {
			out = append(out, n+": not defined")
			continue
		}
		end := matchParen(src, loc[1]-1)
		b := strings.IndexByte(src[end:], '{')
		if end < 0 || b < 0 {
			out = append(out, n+": no body")
			continue
		}
		bd, ok := body(end + b)
		if !ok {
			out = append(out, n+": unbalanced body")
			continue
		}
		stmts := strings.Split(squeeze(bd), ";")
		if len(stmts) < 3 || !regexp.MustCompile(`^gemv_smem_stage<\d+>\(W,N,K\)$`).MatchString(stmts[0]) || stmts[1] != "PDL_WAIT()" {
			out = append(out, fmt.Sprintf("%s: begins %q, not the staging of W then PDL_WAIT()", n, strings.Join(stmts[:min(2, len(stmts))], ";")))
		}
	}
	loc := regexp.MustCompile(`void\s+gemv_smem_stage\s*\(`).FindStringIndex(src)
	if loc == nil {
		return append(out, "gemv_smem_stage: not defined")
	}
	end := matchParen(src, loc[1]-1)
	if end < 0 {
		return append(out, "gemv_smem_stage: unbalanced parameters")
	}
	if p := squeeze(src[loc[1]:end]); p != "constu16*__restrict__W,intN,intK" {
		out = append(out, fmt.Sprintf("gemv_smem_stage takes %q: only the weights and their shape may be read before the wait", p))
	}
	b := strings.IndexByte(src[end:], '{')
	if bd, ok := body(end + b); b < 0 || !ok || !strings.Contains(bd, "gsm_cp16(") {
		out = append(out, "gemv_smem_stage copies nothing into shared memory")
	}
	return out
}

// TestPDLWeightsFirst: the pdlWeightsFirst kernels read only weights
// before PDL_WAIT(), are on no other PDL list, and the checker itself
// finds the ways that could break.
func TestPDLWeightsFirst(t *testing.T) {
	var names []string
	for n := range pdlWeightsFirst {
		names = append(names, n)
		if pdlKernels[n] || pdlMoreKernels[n] {
			t.Errorf("%s is on pdlWeightsFirst and another PDL list", n)
		}
		if !pdlFor(n) && pdlSel.plain == nil {
			t.Errorf("%s does not launch programmatically with PDL on", n)
		}
	}
	for _, r := range gemvSmemRows {
		if n := fmt.Sprintf("gemv_bf16_smem_r%d", r); !pdlWeightsFirst[n] {
			t.Errorf("the launcher's variant %s is not on pdlWeightsFirst", n)
		}
	}
	if p := weightsFirstProblems(stripComments(KernelSource()), names); len(p) > 0 {
		t.Errorf("the module's pdlWeightsFirst kernels:\n%s", strings.Join(p, "\n"))
	}
	good := `
template <int R> __device__ void gemv_smem_stage(const u16* __restrict__ W, int N, int K) { gsm_cp16(0, W); }
extern "C" __global__ void __launch_bounds__(256, 1) k1(const u16* W, const float* x, int N, int K) {
  gemv_smem_stage<1>(W, N, K);
  PDL_WAIT();
  y[0] = x[0];
}`
	if p := weightsFirstProblems(good, []string{"k1"}); len(p) > 0 {
		t.Errorf("a good kernel refused: %v", p)
	}
	for _, bad := range []struct{ name, src string }{
		{"wait second", strings.Replace(good, "gemv_smem_stage<1>(W, N, K);\n  PDL_WAIT();", "PDL_WAIT();\n  gemv_smem_stage<1>(W, N, K);", 1)},
		{"x read first", strings.Replace(good, "gemv_smem_stage<1>(W, N, K);", "float v = x[0];\n  gemv_smem_stage<1>(W, N, K);", 1)},
		{"x staged", strings.Replace(good, "gemv_smem_stage<1>(W, N, K);", "gemv_smem_stage<1>(x, N, K);", 1)},
		{"helper takes x", strings.Replace(good, "int N, int K) { gsm", "int N, int K, const float* x) { gsm", 1)},
		{"helper copies nothing", strings.Replace(good, "gsm_cp16(0, W);", "", 1)},
		{"kernel missing", strings.Replace(good, "k1(", "k2(", 1)},
	} {
		if p := weightsFirstProblems(bad.src, []string{"k1"}); len(p) == 0 {
			t.Errorf("%s: not found", bad.name)
		}
	}
}

// TestNVRTCCompilesGemvSmem: the kernels compile with NVRTC for sm_90
// (and for sm_80, the oldest with cp.async; absent below it) without
// spills; ptxas -v's registers are logged. No GPU needed.
func TestNVRTCCompilesGemvSmem(t *testing.T) {
	nv, err := cuda.LoadNVRTC()
	if err != nil {
		t.Skipf("no NVRTC here, compile check skipped: %v", err)
	}
	var src strings.Builder
	for _, f := range []string{"cu/common.cuh", "cu/gemv.cu", "cu/gemv_wide.cu"} {
		b, err := kernelFS.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		src.Write(b)
		src.WriteString("\n")
	}
	for _, arch := range []string{"sm_90", "sm_80"} {
		_, log, err := nv.CompileLog(src.String(), "gemv_smem.cu", append(kernelOptions(arch), "-Xptxas", "-v"), true)
		if err != nil {
			t.Logf("NVRTC %s refused %s with -Xptxas -v (registers and spills not shown): %v", nv.Version(), arch, err)
			continue
		}
		sp, _ := ptxasSpills(log)
		for _, r := range gemvSmemRows {
			n := fmt.Sprintf("gemv_bf16_smem_r%d", r)
			i := strings.Index(log, "Compiling entry function '"+n+"'")
			if i < 0 {
				t.Errorf("%s: ptxas compiled no %s", arch, n)
				continue
			}
			line := log[i:]
			if j := strings.Index(line, "Used "); j >= 0 {
				line = line[j:]
				if e := strings.IndexByte(line, '\n'); e >= 0 {
					line = line[:e]
				}
			}
			t.Logf("%s %s: %s", arch, n, line)
			if s, ok := sp[n]; ok {
				t.Errorf("%s %s spills (%s bytes of spill stores)", arch, n, s)
			}
		}
	}
}

// smemCase is one GemvBF16Smem check; fits says whether the kernel itself
// must take it on an H200-sized GPU (else the wide fallback runs).
type smemCase struct {
	gemvCase
	fits bool
}

// TestKernelGemvSmem: the on-chip GEMV against the float64 reference on
// fresh random inputs at both routers' shapes (1..4 rows), the tiny
// presets', odd shapes (1, 2 and 4 rows a block, a partial last trip and
// block), with a residual and padded x; a second launch bit for bit the
// first; shapes it cannot take through the fallback; plain and
// programmatic launches. Then in a graph, launched programmatically right
// after the add_rmsnorm that writes its x (x poisoned before, three
// layers, replayed on fresh inputs): outputs against the reference and bit
// for bit a direct launch on the same x.
func TestKernelGemvSmem(t *testing.T) {
	onGPU(t, func(c *cuda.Ctx, k *Set, a *allocs, r *rand.Rand) {
		s := c.Stream()
		pdls := []bool{false}
		if k.PDLSupported() {
			pdls = append(pdls, true)
		}
		defer k.SetPDL(k.PDL())
		info := c.Info()
		big := info.SMs >= 128 && info.MaxSharedOptin >= 200<<10 && info.CCMajor >= 8
		t.Logf("%d SMs, %d bytes of shared memory a block, sm_%d%d", info.SMs, info.MaxSharedOptin, info.CCMajor, info.CCMinor)
		cases := []smemCase{
			{gemvCase{256, 7168, 1, 0, false}, true}, {gemvCase{256, 7168, 2, 0, false}, true},
			{gemvCase{256, 7168, 3, 8, true}, true}, {gemvCase{256, 7168, 4, 0, false}, true},
			{gemvCase{256, 6144, 1, 0, false}, true}, {gemvCase{256, 6144, 4, 4, true}, true},
			{gemvCase{16, 160, 1, 0, false}, true}, {gemvCase{16, 288, 3, 4, false}, true},
			{gemvCase{37, 264, 2, 0, true}, true}, {gemvCase{129, 2048, 1, 0, false}, true},
			{gemvCase{300, 1000, 4, 4, true}, true}, {gemvCase{520, 8, 1, 0, false}, true},
			{gemvCase{1, 8, 1, 0, false}, true}, {gemvCase{255, 4104, 2, 0, true}, true},
			// The fallback: K not whole chunks, too many rows, x past shared memory.
			{gemvCase{64, 100, 2, 0, false}, false}, {gemvCase{4*info.SMs + 1, 512, 1, 0, false}, false},
			{gemvCase{256, 16384, 4, 0, false}, false},
		}
		for _, pdl := range pdls {
			k.SetPDL(pdl)
			for _, cs := range cases {
				N, K, M, ldx := cs.N, cs.K, cs.M, cs.K+cs.pad
				w := randBF16(r, N*K, 0.05)
				x, resid, rp := gemvRows(r, a, cs.gemvCase)
				xp, wp := a.up(x), a.up(w)
				ok := k.GemvBF16SmemOK(xp, wp, N, K, M, ldx)
				rr, smem, _ := gemvSmemPlan(info.SMs, info.MaxSharedOptin, N, K, M)
				name := fmt.Sprintf("gemv_bf16_smem %s R=%d smem=%d own=%v pdl=%v", cs.dims(), rr, smem, ok, pdl)
				if big && ok != cs.fits {
					t.Errorf("%s: GemvBF16SmemOK %v, want %v", name, ok, cs.fits)
				}
				var runs [2][]float32
				for i := range runs {
					yp := a.poisoned(M * N)
					chk(k.GemvBF16Smem(s, yp, xp, wp, rp, N, K, M, ldx, N))
					runs[i] = downF32(c, yp, M*N)
				}
				ref := refGemv(func(n, kk int) float64 { return bf16ToF64(w[n*K+kk]) }, x, resid, N, K, M, ldx, N)
				record(t, name, relMetric, relErr(runs[0], ref), boundF32)
				record(t, name+" repeat", "differing outputs", float64(diffCount(runs[0], runs[1])), 0)
			}
			testGemvSmemGraph(t, c, k, a, r, pdl)
		}
	})
}

// testGemvSmemGraph: three layers of (x poisoned, add_rmsnorm writing x,
// the on-chip GEMV of x) captured as one graph, replayed twice on fresh
// residual inputs; each layer's outputs against the reference from the x
// the norm wrote, and bit for bit a direct launch on that x.
func testGemvSmemGraph(t *testing.T, c *cuda.Ctx, k *Set, a *allocs, r *rand.Rand, pdl bool) {
	s := c.Stream()
	const layers = 3
	for _, sh := range []struct{ N, K, M int }{{256, 7168, 1}, {256, 6144, 4}, {37, 264, 2}} {
		N, K, M := sh.N, sh.K, sh.M
		type layer struct {
			w                  []uint16
			wp, h, b, nw, x, y cuda.DevPtr
		}
		ls := make([]layer, layers)
		for i := range ls {
			ls[i].w = randBF16(r, N*K, 0.05)
			ls[i].wp = a.up(ls[i].w)
			ls[i].h, ls[i].b = a.raw(int64(4*M*K)), a.up(randF32(r, M*K, 0.1))
			ls[i].nw = a.up(randF32(r, K, 1))
			ls[i].x, ls[i].y = a.raw(int64(4*M*K)), a.raw(int64(4*M*N))
		}
		chk(c.SyncStream(s))
		chk(c.BeginCapture(s))
		for _, l := range ls {
			chk(c.MemsetD32(l.x, 0x7fc00000, int64(M*K), s))
			chk(k.AddRMSNorm(s, l.x, l.h, l.b, l.nw, M, K, K, K, K, 1e-6))
			chk(k.GemvBF16Smem(s, l.y, l.x, l.wp, 0, N, K, M, K, N))
		}
		g, err := c.EndCapture(s)
		chk(err)
		for rep := range 2 {
			for _, l := range ls {
				chk(c.Upload(l.h, randF32(r, M*K, 1)))
			}
			chk(c.LaunchGraph(g, s))
			chk(c.SyncStream(s))
			for i, l := range ls {
				x, y := downF32(c, l.x, M*K), downF32(c, l.y, M*N)
				name := fmt.Sprintf("gemv_bf16_smem after add_rmsnorm in a graph N=%d K=%d M=%d layer %d replay %d pdl=%v", N, K, M, i, rep, pdl)
				ref := refGemv(func(n, kk int) float64 { return bf16ToF64(l.w[n*K+kk]) }, x, nil, N, K, M, K, N)
				record(t, name, relMetric, relErr(y, ref), boundF32)
				yd := a.poisoned(M * N)
				chk(k.GemvBF16Smem(s, yd, l.x, l.wp, 0, N, K, M, K, N))
				record(t, name+" vs direct", "differing outputs", float64(diffCount(y, downF32(c, yd, M*N))), 0)
			}
		}
		chk(c.DestroyGraph(g))
	}
}

// TestKernelGemvSmemTiming (TILERT_GPU_TIMING=1): the router GEMV as the
// decode step runs it, graph-timed: each launch right after the layer's
// add_rmsnorm (one block, writing the GEMV's x) and before moe_route, the
// weights cycled over cold copies, plain and programmatic launches, so the
// on-chip kernel's staging before its wait shows. Rows per call: the norm
// alone, norm + gemv_bf16_wide, norm + gemv_bf16_smem, and each with
// moe_route after; "after the norm" is the pair less the norm alone.
func TestKernelGemvSmemTiming(t *testing.T) {
	needTiming(t)
	onGPU(t, func(c *cuda.Ctx, k *Set, a *allocs, r *rand.Rand) {
		s := c.Stream()
		add := timingTable(t, c, a, r, 256<<20, "router: device-to-device copy 256 MiB (read+write)", "reference of this table")
		pdls := []bool{false}
		if k.PDLSupported() {
			pdls = append(pdls, true)
		}
		defer k.SetPDL(k.PDL())
		for _, cs := range []struct {
			name              string
			N, K, topk        int
			ngroup, topkGroup int
		}{{"deepseek-v3.2", 256, 7168, 8, 8, 4}, {"glm-5", 256, 6144, 8, 1, 1}} {
			N, K := cs.N, cs.K
			wb := int64(2 * N * K)
			nc := coldCopies(wb)
			ws := make([]cuda.DevPtr, nc)
			for i := range ws {
				ws[i] = a.raw(wb)
				fillRandom(c, r, ws[i], wb, "bf16")
			}
			bias := a.up(randF32(r, N, 0.1))
			for _, M := range []int{1, 2, 4} {
				h, b, nw := a.up(randF32(r, M*K, 1)), a.up(randF32(r, M*K, 1e-3)), a.up(randF32(r, K, 1))
				x, y := a.raw(int64(4*M*K)), a.raw(int64(4*M*N))
				idx, wts := a.raw(int64(4*M*cs.topk)), a.raw(int64(4*M*cs.topk))
				bytes := float64(wb + int64(4*M*(K+N)))
				norm := func() { chk(k.AddRMSNorm(s, x, h, b, nw, M, K, K, K, K, 1e-6)) }
				route := func() {
					chk(k.MoERoute(s, idx, wts, y, bias, M, N, cs.topk, cs.ngroup, cs.topkGroup, true, 2.5))
				}
				gemvs := []struct {
					name string
					f    func(i int)
				}{
					{"gemv_bf16_wide", func(i int) { chk(k.GemvBF16Wide(s, y, x, ws[i], 0, N, K, M, K, N)) }},
					{"gemv_bf16_smem", func(i int) { chk(k.GemvBF16Smem(s, y, x, ws[i], 0, N, K, M, K, N)) }},
				}
				for _, pdl := range pdls {
					k.SetPDL(pdl)
					tag := fmt.Sprintf("%s N=%d K=%d M=%d pdl=%v, cold, graph", cs.name, N, K, M, pdl)
					alone := graphUsRot(c, s, nc, 21, func(int) { norm() })
					add(fmtName("router: add_rmsnorm alone %s", tag), float64(4*M*K*3), alone, "")
					var after [2]float64
					for j, g := range gemvs {
						pair := graphUsRot(c, s, nc, 21, func(i int) { norm(); g.f(i) })
						after[j] = pair - alone
						cm := fmtName("%.2f us after the norm", after[j])
						if j == 1 {
							cm += fmtName(", %.2fx gemv_bf16_wide's", after[0]/after[1])
						}
						add(fmtName("router: add_rmsnorm + %s %s", g.name, tag), bytes, pair, cm)
						three := graphUsRot(c, s, nc, 21, func(i int) { norm(); g.f(i); route() })
						add(fmtName("router: add_rmsnorm + %s + moe_route %s", g.name, tag), bytes, three, fmtName("%.2f us after the norm", three-alone))
					}
				}
			}
		}
	})
}

// The plan's grid: every compiled variant named by the launcher exists in
// the module source.
func TestGemvSmemVariantsDefined(t *testing.T) {
	src := KernelSource()
	for _, r := range gemvSmemRows {
		if n := fmt.Sprintf("gemv_bf16_smem_r%d(", r); !strings.Contains(src, n) {
			t.Errorf("%s not defined in the kernels", n)
		}
	}
}
