package kernels

import (
	"fmt"
	"regexp"
	"sort"
	"strings"
	"testing"

	"github.com/tilert-go/tilert/cuda"
)

// preprocessEarly keeps what a compile with (early) or without
// TILERT_PDL_EARLY sees of the #ifdef / #ifndef TILERT_PDL_EARLY regions
// (with their #else); other conditionals and their lines stay as they are.
func preprocessEarly(src string, early bool) string {
	type frame struct {
		ours bool // a TILERT_PDL_EARLY conditional
		keep bool // its current branch is compiled
	}
	var stack []frame
	keeping := func() bool {
		for _, f := range stack {
			if f.ours && !f.keep {
				return false
			}
		}
		return true
	}
	var b strings.Builder
	for _, line := range strings.Split(src, "\n") {
		tl := strings.Join(strings.Fields(line), " ")
		switch {
		case tl == "#ifdef TILERT_PDL_EARLY":
			stack = append(stack, frame{true, early})
			continue
		case tl == "#ifndef TILERT_PDL_EARLY":
			stack = append(stack, frame{true, !early})
			continue
		case strings.HasPrefix(tl, "#if"):
			stack = append(stack, frame{})
		case strings.HasPrefix(tl, "#else") && len(stack) > 0 && stack[len(stack)-1].ours:
			stack[len(stack)-1].keep = !stack[len(stack)-1].keep
			continue
		case strings.HasPrefix(tl, "#endif") && len(stack) > 0:
			ours := stack[len(stack)-1].ours
			stack = stack[:len(stack)-1]
			if ours {
				continue
			}
		}
		if keeping() {
			b.WriteString(line)
			b.WriteByte('\n')
		}
	}
	return b.String()
}

type cParam struct {
	name string
	ptr  bool
}

type cFunc struct {
	params []cParam
	body   string // between the braces, comments stripped, lines joined
}

var refParamRe = regexp.MustCompile(`\(\s*&\s*([A-Za-z_]\w*)\s*\)`)

// findFunc finds the definition `void name(...) { ... }` in src (comments
// and preprocessor lines already gone).
func findFunc(src, name string) (cFunc, bool) {
	re := regexp.MustCompile(`\bvoid\s+(?:__launch_bounds__\s*\([^()]*\)\s*)?` + name + `\s*\(`)
	for _, loc := range re.FindAllStringIndex(src, -1) {
		open := loc[1] - 1
		close := matchParen(src, open)
		if close < 0 {
			continue
		}
		rest := strings.TrimSpace(src[close+1:])
		if !strings.HasPrefix(rest, "{") {
			continue // a declaration
		}
		b := close + 1 + strings.IndexByte(src[close+1:], '{')
		d, e := 0, -1
		for i := b; i < len(src); i++ {
			if src[i] == '{' {
				d++
			} else if src[i] == '}' {
				d--
				if d == 0 {
					e = i
					break
				}
			}
		}
		if e < 0 {
			return cFunc{}, false
		}
		var f cFunc
		for _, p := range splitArgs(src[open+1 : close]) {
			if p == "" {
				continue
			}
			p = strings.TrimSpace(strings.SplitN(p, "=", 2)[0]) // default arguments
			nm := ""
			if m := refParamRe.FindStringSubmatch(p); m != nil {
				nm = m[1]
			} else if m := nameRe.FindStringSubmatch(p); m != nil {
				nm = m[1]
			}
			f.params = append(f.params, cParam{name: nm, ptr: strings.Contains(p, "*")})
		}
		f.body = src[b+1 : e]
		return f, true
	}
	return cFunc{}, false
}

var (
	identRe = regexp.MustCompile(`(^|[^.\w>])([A-Za-z_]\w*)`) // not a member (blockIdx.x, p->x)
	callRe  = regexp.MustCompile(`\b([A-Za-z_]\w*)\s*(?:<[^<>;(){}]*>)?\s*\(`)
)

const streamWait = "PDL_STREAM_WAIT();"

// preWait is the part of body before its first PDL_STREAM_WAIT() at the
// body's top level (whitespace squeezed), or ok = false when there is none
// there (a wait inside a branch or loop would not cover every path).
func preWait(body string) (string, bool) {
	s := strings.Join(strings.Fields(body), "")
	d := 0
	for i := 0; i < len(s); i++ {
		switch s[i] {
		case '{':
			d++
		case '}':
			d--
		}
		if d == 0 && strings.HasPrefix(s[i:], streamWait) {
			return s[:i], true
		}
	}
	return "", false
}

// pdlPrologueCalls are what may be called before the wait: weight loads,
// index arithmetic, and the pre-wait helpers checked themselves below.
var pdlPrologueCalls = setOf("if", "for", "min", "max", "make_uint4", "tile_ld16", "ldg_stream16", "__ldg", "tile_pre", "load", "prefetchL2", "__trap")

var nullPtrRe = regexp.MustCompile(`^\(const\w*\*\)0$`)

// earlyPrologueErrors checks function fn of the TILERT_PDL_EARLY source:
// with wait set, its body must hold PDL_STREAM_WAIT() at top level, and the
// part before it (else the whole body: a helper called before the wait)
// may name, of fn's pointer parameters, only those in weights, may call
// only pdlPrologueCalls, and may use no atomics or asm.
func earlyPrologueErrors(src, fn string, wait bool, weights ...string) []string {
	f, ok := findFunc(src, fn)
	if !ok {
		return []string{fmt.Sprintf("%s: no definition found", fn)}
	}
	pre := strings.Join(strings.Fields(f.body), "")
	if wait {
		var ok bool
		if pre, ok = preWait(f.body); !ok {
			return []string{fmt.Sprintf("%s: no PDL_STREAM_WAIT(); at the top level of its body", fn)}
		}
	}
	// An L2 prefetch (of the weight rows) is the one asm admitted.
	pre = strings.ReplaceAll(pre, `asmvolatile("prefetch.global.L2[%0];"::"l"(`, "prefetchL2(")
	var errs []string
	named := map[string]bool{}
	for _, m := range identRe.FindAllStringSubmatch(pre, -1) {
		named[m[2]] = true
	}
	allowed := setOf(weights...)
	for _, p := range f.params {
		if p.ptr && named[p.name] && !allowed[p.name] {
			errs = append(errs, fmt.Sprintf("%s: pointer argument %s is used before the wait (only the weights %v may be)", fn, p.name, weights))
		}
	}
	for _, m := range callRe.FindAllStringSubmatch(pre, -1) {
		if !pdlPrologueCalls[m[1]] {
			errs = append(errs, fmt.Sprintf("%s: calls %s before the wait", fn, m[1]))
		}
	}
	for _, bad := range []string{"atomic", "asm", "__stcg", "__stwt"} {
		if strings.Contains(pre, bad) {
			errs = append(errs, fmt.Sprintf("%s: %s before the wait", fn, bad))
		}
	}
	return errs
}

// derefErrors: fn dereferences none of its pointer parameters (a function
// that only selects pointers before handing them to a checked body).
func derefErrors(src, fn string) []string {
	f, ok := findFunc(src, fn)
	if !ok {
		return []string{fmt.Sprintf("%s: no definition found", fn)}
	}
	body := strings.Join(strings.Fields(f.body), " ")
	var errs []string
	for _, p := range f.params {
		if !p.ptr {
			continue
		}
		q := regexp.QuoteMeta(p.name)
		if regexp.MustCompile(`\b` + q + `\s*(\[|->)|\*\s*\(?\s*` + q + `\b[^*]`).MatchString(body) {
			errs = append(errs, fmt.Sprintf("%s: dereferences %s", fn, p.name))
		}
	}
	return errs
}

// The TILERT_PDL_EARLY module's weight-streaming kernels (pdl.go's
// pdlStreamKernels) may touch, before their griddepcontrol.wait, kernel
// arguments that are weights only: each begins with PDL_WAIT_STREAM()
// (TestPDLKernelsWait) and then calls one of the checked bodies with its
// own arguments in place; gemv_tile_body's and gemv_group_body's parts
// before their top-level PDL_STREAM_WAIT() name no activation, index or
// output pointer and call only weight loads and the checked helpers; the
// segment selection of the grouped kernels reads no memory.
func TestPDLEarlyPrologue(t *testing.T) {
	src := preprocessEarly(KernelSource(), true)
	clean := ppLineRe.ReplaceAllString(strings.ReplaceAll(stripComments(src), "\\\n", " "), "")
	for _, e := range pdlEarlyErrors(clean) {
		t.Error(e)
	}
	// The kernels: PDL_WAIT_STREAM(); then a call of a checked body with the
	// kernel's arguments under the callee's parameter names.
	// The checked bodies and their weight parameters: a kernel may pass
	// only its own argument of that name there (or a null pointer).
	bodies := map[string][]string{
		"gemv_tile_body":    {"W0", "S0", "W1", "S1"},
		"gemv_group_run":    {"w0", "s0", "w1", "s1", "w2", "s2", "w3", "s3"},
		"gemv_group_run_sn": {"w0", "s0", "w1", "s1", "w2", "s2", "w3", "s3"},
		"gemv_wide_rows":    {"W", "S"},
	}
	var names []string
	for n := range pdlStreamKernels {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		f, ok := findFunc(clean, n)
		if !ok {
			t.Errorf("%s: no definition found", n)
			continue
		}
		b := strings.Join(strings.Fields(f.body), "")
		if !strings.HasPrefix(b, pdlStreamEntry) {
			t.Errorf("%s: does not begin with PDL_WAIT_STREAM()", n)
			continue
		}
		m := callRe.FindStringSubmatchIndex(b[len(pdlStreamEntry):])
		if m == nil {
			t.Errorf("%s: no call after PDL_WAIT_STREAM()", n)
			continue
		}
		callee := b[len(pdlStreamEntry):][m[2]:m[3]]
		weights, ok := bodies[callee]
		if !ok {
			t.Errorf("%s: calls %s, not a checked body", n, callee)
			continue
		}
		open := len(pdlStreamEntry) + m[1] - 1
		close := matchParen(b, open)
		if close < 0 || strings.TrimSpace(b[close+1:]) != ";" {
			t.Errorf("%s: the body call is not its last statement", n)
			continue
		}
		args := splitArgs(b[open+1 : close])
		cf, _ := findFunc(clean, callee)
		if len(args) != len(cf.params) {
			t.Errorf("%s: %d arguments to %s, which has %d parameters", n, len(args), callee, len(cf.params))
			continue
		}
		isW := setOf(weights...)
		for i, a := range args {
			if p := cf.params[i].name; isW[p] && a != p && !nullPtrRe.MatchString(a) {
				t.Errorf("%s: passes %q as %s's weights %s", n, a, callee, p)
			}
		}
	}
	// The peeled first round of each body is the loop's arithmetic block,
	// token for token (same sums, same bits), and the default module has
	// the loop's block alone.
	for _, e := range peeledRoundErrors(clean, preprocessEarly(KernelSource(), false)) {
		t.Error(e)
	}
	// In the default module the macros leave no early code behind.
	def := preprocessEarly(KernelSource(), false)
	for _, bad := range []string{"tile_pre", "pwv"} {
		if strings.Contains(stripComments(def), bad) {
			t.Errorf("the default module contains %s (TILERT_PDL_EARLY code outside its #ifdef)", bad)
		}
	}
}

// pdlEarlyErrors runs the body checks on a TILERT_PDL_EARLY source.
func pdlEarlyErrors(src string) []string {
	var errs []string
	errs = append(errs, earlyPrologueErrors(src, "gemv_tile_body", true, "W0", "S0", "W1", "S1")...)
	errs = append(errs, earlyPrologueErrors(src, "tile_pre", false, "W0", "S0", "W1", "S1")...)
	errs = append(errs, earlyPrologueErrors(src, "gemv_group_body", true, "W", "S")...)
	errs = append(errs, earlyPrologueErrors(src, "gemv_wide_rows", true, "W", "S")...)
	for _, fn := range []string{"gemv_group_run", "gemv_group_run_sn"} {
		errs = append(errs, derefErrors(src, fn)...)
		f, ok := findFunc(src, fn)
		if !ok {
			continue
		}
		b := strings.Join(strings.Fields(f.body), "")
		// W and S are only ever the segments' weights.
		for _, m := range regexp.MustCompile(`\b([WS])=(\w+)`).FindAllStringSubmatch(b, -1) {
			if !regexp.MustCompile(`^` + strings.ToLower(m[1]) + `[0-3]$`).MatchString(m[2]) {
				errs = append(errs, fmt.Sprintf("%s: %s takes %s, not a segment's weights", fn, m[1], m[2]))
			}
		}
		for _, m := range regexp.MustCompile(`gemv_group_body<[^>]*>\(([^,]*),([^,]*),`).FindAllStringSubmatch(b, -1) {
			if !regexp.MustCompile(`^(W|w[0-3])$`).MatchString(m[1]) || !regexp.MustCompile(`^(S|s[0-3])$`).MatchString(m[2]) {
				errs = append(errs, fmt.Sprintf("%s: gemv_group_body gets %s, %s as its weights", fn, m[1], m[2]))
			}
		}
	}
	return errs
}

// The checks fail on planted prologues: an activation read, an index read,
// an output write, a wait inside a branch, no wait, a foreign call, and a
// helper that reads an activation.
func TestPDLEarlyPrologueCheck(t *testing.T) {
	good := `
template <class T, int R, int NI>
__device__ void tile_pre(const void* W0, const float* S0, const void* W1, const float* S1, int N, int K, int G,
                         uint4 (&wv)[NI][R], float (&scg)[NI], float (&scu)[NI]) {
  const char* p = (const char*)W0 + min(N, K);
  wv[0][0] = tile_ld16(p);
  scg[0] = S0 ? __ldg(S0) : 1.0f;
}
template <class T, int R, int MM, int LD = 8>
__device__ void gemv_tile_body(const void* const* T0, const int* ids, int slots, const void* W0, const float* S0,
                               const void* W1, const float* S1, const float* x, float* y, int N, int K, int G) {
  const int j = blockIdx.y;
  uint4 pwv[1][1];
  float pscg[1], pscu[1];
  const bool pre = j >= slots;
  if (pre) tile_pre<T, R, 1>(W0, S0, W1, S1, N, K, G, pwv, pscg, pscu);
  PRE_EXTRA
  PDL_STREAM_WAIT();
  y[0] = x[ids[0]];
}
template <class T, int R, int MM, bool SN = false>
__device__ void gemv_group_body(const void* W, const float* S, float* y, int N, const float* x, float* xs = nullptr) {
  const char* wr = (const char*)W;
  uint4 wv;
  auto load = [&](int c0) { wv = tile_ld16(wr + c0); };
  load(0);
  PDL_STREAM_WAIT();
  y[0] = x[0];
}
__device__ void gemv_group_run(const float* x, const void* w0, const float* s0, float* y0, const void* w1,
                               const float* s1, float* y1) {
  const void* W = w0;
  const float* S = s0;
  float* y = y0;
  if (blockIdx.x > 0) { W = w1, S = s1, y = y1; }
  gemv_group_body<TFP8, 2, 1>(W, S, y, 4, x);
}
template <class T, int R>
__device__ void gemv_wide_rows(const void* W, const float* S, const float* x, float* y, const float* resid, int N, int K) {
  const char* wr = (const char*)W + N;
  uint4 pwv = ldg_stream16(wr);
  float psc = S ? __ldg(S + K) : 1.0f;
  PDL_STREAM_WAIT();
  y[0] = x[0] + resid[0];
}
__device__ void gemv_group_run_sn(const float* x, const void* w0, const float* s0, float* y0) {
  gemv_group_body<TFP8, 2, 1, true>(w0, s0, y0, 4, x);
}
`
	if errs := pdlEarlyErrors(good); len(errs) != 0 {
		t.Fatalf("the good source fails: %v", errs)
	}
	bad := map[string]string{
		"activation read":  strings.Replace(good, "PRE_EXTRA", "float v = x[0];", 1),
		"index read":       strings.Replace(good, "PRE_EXTRA", "int e = ids[j];", 1),
		"output write":     strings.Replace(good, "PRE_EXTRA", "y[0] = 0.0f;", 1),
		"expert table":     strings.Replace(good, "PRE_EXTRA", "const void* w = T0[0];", 1),
		"foreign call":     strings.Replace(good, "PRE_EXTRA", "tile_ldx<4>(S0, pscg);", 1),
		"atomic":           strings.Replace(good, "PRE_EXTRA", "atomicAdd((int*)S0, 1);", 1),
		"wait in a branch": strings.Replace(good, "  PRE_EXTRA\n  PDL_STREAM_WAIT();", "  if (pre) { PDL_STREAM_WAIT(); }", 1),
		"no wait":          strings.Replace(good, "  PRE_EXTRA\n  PDL_STREAM_WAIT();\n  y[0] = x[ids[0]];", "  y[0] = x[ids[0]];", 1),
		"helper reads x":   strings.Replace(strings.Replace(good, "int N, int K, int G,\n", "int N, int K, int G, const float* x,\n", 1), "scg[0] = S0", "scg[0] = x[0] + S0", 1),
		"group reads x":    strings.Replace(good, "  load(0);\n  PDL_STREAM_WAIT();", "  load(0);\n  float v = x[0];\n  PDL_STREAM_WAIT();", 1),
		"group call":       strings.Replace(good, "auto load = [&](int c0) { wv = tile_ld16(wr + c0); };", "auto load = [&](int c0) { wv = tile_ld16(wr + c0); };\n  gg_staged_sumsq(x);", 1),
		"run derefs x":     strings.Replace(good, "  float* y = y0;\n", "  float* y = y0;\n  float v = x[0];\n", 1),
		"run picks x as W": strings.Replace(good, "W = w1, S = s1", "W = x, S = s1", 1),
		"wide reads resid": strings.Replace(good, "float psc = S ? __ldg(S + K) : 1.0f;", "float psc = S ? __ldg(S + K) : resid[0];", 1),
		"sn passes y as W": strings.Replace(good, "(w0, s0, y0, 4, x)", "(y0, s0, y0, 4, x)", 1),
	}
	for name, src := range bad {
		if src == good {
			t.Errorf("%s: the plant did not apply", name)
			continue
		}
		errs := pdlEarlyErrors(strings.Replace(src, "PRE_EXTRA", "", 1))
		if len(errs) == 0 {
			t.Errorf("%s: passed the check", name)
		} else {
			t.Logf("%s: %s", name, errs[0])
		}
	}
	// A peeled round that sums in another order fails.
	src := preprocessEarly(KernelSource(), true)
	clean := ppLineRe.ReplaceAllString(strings.ReplaceAll(stripComments(src), "\\\n", " "), "")
	const sum = "p[r] = fmaf(wf[e], xv[e], p[r]);"
	if !strings.Contains(clean, sum) {
		t.Fatalf("no %q in the early source", sum)
	}
	swapped := strings.Replace(clean, sum, "p[r] = fmaf(xv[e], wf[e], p[r]);", 1)
	if errs := peeledRoundErrors(swapped, preprocessEarly(KernelSource(), false)); len(errs) == 0 {
		t.Errorf("a peeled round with swapped operands passed the check")
	} else {
		t.Logf("swapped operands: %s", errs[0])
	}
	// preprocessEarly keeps the right branch.
	pp := "a\n#ifdef TILERT_PDL_EARLY\nb\n#if X\nc\n#endif\n#else\nd\n#endif\n#ifndef TILERT_PDL_EARLY\ne\n#endif\nf\n"
	if got := strings.Fields(preprocessEarly(pp, true)); strings.Join(got, "") != "ab#ifXc#endiff" {
		t.Errorf("early: %q", got)
	}
	if got := strings.Fields(preprocessEarly(pp, false)); strings.Join(got, "") != "adef" {
		t.Errorf("default: %q", got)
	}
}

// TestNVRTCCompilesEarlyModule: the TILERT_PDL_EARLY compile of the module
// (TILERT_GPU_PDL=2) builds with this NVRTC for sm_90 (compute capability
// 9.0, as Load asks on an H100/H200), through the default kernel cache, so
// a device run that starts it beside the first Load finds it there.
func TestNVRTCCompilesEarlyModule(t *testing.T) {
	nv, err := cuda.LoadNVRTC()
	if err != nil {
		t.Skipf("no NVRTC here, compile check skipped: %v", err)
	}
	if !nv.CanCompileSM90a() {
		// Seen in CI (session 8): NVRTC 11.8 died with SIGSEGV inside
		// nvrtcCompileProgram after ~3 minutes on this module (the default
		// module compiles). The H200's NVRTC 13 and 12.9 build it; .ci/run
		// runs this test with 12.9.
		t.Skipf("NVRTC %s (%s): the early module is checked with NVRTC 12 or newer (11.8 crashes compiling it); set TILERT_NVRTC to a libnvrtc.so.12", nv.Version(), nv.Lib)
	}
	ck, err := CompileEarly(nv, 9, 0, cuda.DefaultKernelCache())
	if err != nil {
		t.Fatalf("%+v", err)
	}
	if len(ck.Image) < 1000 {
		t.Fatalf("image %d bytes", len(ck.Image))
	}
	t.Logf("NVRTC %s: the early module for %s (cubin %v), %d bytes, cache hit %v, %v", nv.Version(), ck.Arch, ck.Cubin, len(ck.Image), ck.CacheHit, ck.Took)
}

// roundBlocks: the bodies whose first round is peeled in the early module,
// and how their arithmetic block (a for over the round's chunks) begins.
var roundBlocks = map[string]string{
	"gemv_tile_body": "for(inti=0;i<NI;i++){constintc=c0+i*G;if(c<C){constfloat*xc=xb+",
	"gemv_wide_rows": "for(intu=0;u<GEMV_WIDE_U;u++){constintc=c0+u*TPR;if(c<C){floatwf[T::E];",
}

// blocksOf returns each for-block of squeezed text s beginning with sig, up
// to its closing brace.
func blocksOf(s, sig string) []string {
	var out []string
	for off := 0; ; {
		i := strings.Index(s[off:], sig)
		if i < 0 {
			return out
		}
		i += off
		d, e := 0, -1
		for j := i; j < len(s); j++ {
			if s[j] == '{' {
				d++
			} else if s[j] == '}' {
				d--
				if d == 0 {
					e = j
					break
				}
			}
		}
		if e < 0 {
			return out
		}
		out = append(out, s[i:e+1])
		off = e + 1
	}
}

// peeledRoundErrors: in early (the TILERT_PDL_EARLY view, comments and
// preprocessor lines gone) each roundBlocks body holds its arithmetic block
// twice, identical; in def (the default view) once.
func peeledRoundErrors(early, def string) []string {
	defClean := ppLineRe.ReplaceAllString(strings.ReplaceAll(stripComments(def), "\\\n", " "), "")
	var errs []string
	for fn, sig := range roundBlocks {
		f, ok := findFunc(early, fn)
		if !ok {
			errs = append(errs, fmt.Sprintf("%s: no definition in the early source", fn))
			continue
		}
		body := strings.Join(strings.Fields(f.body), "")
		// The peeled round (from its c0 to the loop's new start) loads
		// nothing: it runs on the registers loaded before the wait.
		if i := strings.Index(body, "constintc0="); i < 0 || !strings.Contains(body[i:], "c0s=") {
			errs = append(errs, fmt.Sprintf("%s: no peeled round (const int c0 = ...; ... c0s = ...)", fn))
		} else if peel := body[i : i+strings.Index(body[i:], "c0s=")]; strings.Contains(peel, "ld16(") || strings.Contains(peel, "load(") || strings.Contains(peel, "ldg_stream16(") {
			errs = append(errs, fmt.Sprintf("%s: the peeled round loads weights again", fn))
		}
		b := blocksOf(body, sig)
		if len(b) != 2 || b[0] != b[1] {
			errs = append(errs, fmt.Sprintf("%s: the early module's peeled round and loop differ (%d blocks beginning %q)", fn, len(b), sig))
		}
		g, ok := findFunc(defClean, fn)
		if !ok {
			errs = append(errs, fmt.Sprintf("%s: no definition in the default source", fn))
			continue
		}
		if d := blocksOf(strings.Join(strings.Fields(g.body), ""), sig); len(d) != 1 || len(b) > 0 && d[0] != b[0] {
			errs = append(errs, fmt.Sprintf("%s: the default module has %d arithmetic blocks, or its block is not the early one's", fn, len(d)))
		}
	}
	sort.Strings(errs)
	return errs
}
