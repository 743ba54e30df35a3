package kernels

import (
	"fmt"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"
)

// stripComments removes // and /* */ comments, leaving string literals alone.
func stripComments(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		switch {
		case s[i] == '"':
			j := i + 1
			for j < len(s) && s[j] != '"' {
				if s[j] == '\\' {
					j++
				}
				j++
			}
			b.WriteString(s[i:min(j+1, len(s))])
			i = j
		case strings.HasPrefix(s[i:], "//"):
			for i < len(s) && s[i] != '\n' {
				i++
			}
			b.WriteByte('\n')
		case strings.HasPrefix(s[i:], "/*"):
			j := strings.Index(s[i+2:], "*/")
			if j < 0 {
				return b.String()
			}
			i += j + 3
			b.WriteByte(' ')
		default:
			b.WriteByte(s[i])
		}
	}
	return b.String()
}

// matchParen returns the index of the parenthesis closing the one at open.
func matchParen(s string, open int) int {
	d := 0
	for i := open; i < len(s); i++ {
		switch s[i] {
		case '(':
			d++
		case ')':
			d--
			if d == 0 {
				return i
			}
		}
	}
	return -1
}

// splitArgs splits a macro invocation's arguments at top-level commas.
func splitArgs(s string) []string {
	var out []string
	d, start := 0, 0
	for i := 0; i < len(s); i++ {
		switch s[i] {
		case '(':
			d++
		case ')':
			d--
		case ',':
			if d == 0 {
				out = append(out, strings.TrimSpace(s[start:i]))
				start = i + 1
			}
		}
	}
	return append(out, strings.TrimSpace(s[start:]))
}

var (
	defineRe = regexp.MustCompile(`(?m)^[ \t]*#[ \t]*define[ \t]+([A-Za-z_]\w*)\(([^)]*)\)(.*)$`)
	ppLineRe = regexp.MustCompile(`(?m)^[ \t]*#.*$`)
	nameRe   = regexp.MustCompile(`([A-Za-z_]\w*)\s*$`)
)

// kernelEntries finds every __global__ definition in CUDA C source and
// returns, per kernel name, the first statement of each of its bodies
// (whitespace squeezed). Function-like macros that define kernels are
// expanded one level, with ## pasting, which is how cu/*.cu writes them.
func kernelEntries(src string) map[string][]string {
	out := map[string][]string{}
	for n, defs := range kernelDefs(src) {
		for _, d := range defs {
			first := ""
			if len(d.stmts) > 0 {
				first = d.stmts[0]
			}
			out[n] = append(out[n], first)
		}
	}
	return out
}

// kernelDef is one definition of a kernel: its parameter list and the
// first statements of its body (whitespace squeezed; up to the first
// compound statement, at most 4).
type kernelDef struct {
	params string
	stmts  []string
}

// firstStatements splits the start of a body at top-level semicolons.
func firstStatements(body string) []string {
	var out []string
	d, start := 0, 0
	for i := 0; i < len(body) && len(out) < 4; i++ {
		switch body[i] {
		case '(':
			d++
		case ')':
			d--
		case '{', '}':
			if d == 0 {
				if st := strings.Join(strings.Fields(body[start:i+1]), ""); st != "" {
					out = append(out, st)
				}
				return out
			}
		case ';':
			if d == 0 {
				out = append(out, strings.Join(strings.Fields(body[start:i+1]), ""))
				start = i + 1
			}
		}
	}
	return out
}

// kernelDefs is kernelEntries with each definition's parameters and first
// statements.
func kernelDefs(src string) map[string][]kernelDef {
	s := strings.ReplaceAll(stripComments(src), "\\\n", " ")
	type macro struct {
		params []string
		body   string
	}
	macros := map[string]macro{}
	for _, m := range defineRe.FindAllStringSubmatch(s, -1) {
		if strings.Contains(m[3], "__global__") {
			macros[m[1]] = macro{params: splitArgs(m[2]), body: m[3]}
		}
	}
	s = ppLineRe.ReplaceAllString(s, "")
	for name, mc := range macros {
		re := regexp.MustCompile(`\b` + name + `\s*\(`)
		for {
			loc := re.FindStringIndex(s)
			if loc == nil {
				break
			}
			end := matchParen(s, loc[1]-1)
			if end < 0 {
				break
			}
			args := splitArgs(s[loc[1]:end])
			body := mc.body
			for i, p := range mc.params {
				if i < len(args) {
					body = regexp.MustCompile(`\b`+regexp.QuoteMeta(p)+`\b`).ReplaceAllLiteralString(body, args[i])
				}
			}
			body = regexp.MustCompile(`\s*##\s*`).ReplaceAllString(body, "")
			s = s[:loc[0]] + body + s[end+1:]
		}
	}
	out := map[string][]kernelDef{}
	for off := 0; ; {
		i := strings.Index(s[off:], "__global__")
		if i < 0 {
			break
		}
		i += off + len("__global__")
		off = i
		p := strings.IndexByte(s[i:], '(')
		if p < 0 {
			break
		}
		p += i
		if strings.HasSuffix(strings.TrimSpace(s[i:p]), "__launch_bounds__") {
			q := matchParen(s, p)
			if q < 0 {
				break
			}
			p2 := strings.IndexByte(s[q:], '(')
			if p2 < 0 {
				break
			}
			i, p = q+1, q+p2
		}
		nm := nameRe.FindStringSubmatch(s[i:p])
		q := matchParen(s, p)
		if nm == nil || q < 0 {
			continue
		}
		b := strings.IndexByte(s[q:], '{')
		if b < 0 {
			break
		}
		out[nm[1]] = append(out[nm[1]], kernelDef{params: s[p+1 : q], stmts: firstStatements(s[q+b+1:])})
		off = q
	}
	return out
}

const pdlEntry = "PDL_WAIT();"

// pdlWeightParams: per kernel-name prefix, the parameters that hold
// weights (never written during a step): the only pointers a prologue
// before PDL_WAIT_LATE may hand to a prefetch helper (common.cuh).
var pdlWeightParams = map[string][]string{
	"gemv_tile_":       {"W0", "W1"},
	"gemv_group_":      {"w0", "w1", "w2", "w3"},
	"gemv_fp8_r":       {"W"},
	"gemv_bf16_r":      {"W"},
	"gemv_f32_r":       {"W"},
	"gemv_mma_":        {"W0", "W1"},
	"gemv_fp8_wide_r":  {"W"},
	"gemv_bf16_wide_r": {"W"},
}

// pdlHelpers are the device functions a prologue may call (and they call):
// their bodies may only compute addresses from scalars and issue
// prefetch.global.L2.
var pdlHelpers = []string{"pdl_pf_range", "pdl_pf_tile", "pdl_pf_group", "pdl_pf_rows", "pdl_pf_mma", "pdl_pf_wide", "group_blocks"}

var (
	pdlLateRe  = regexp.MustCompile(`^PDL_WAIT_LATE\((\w+)>=0\);$`)
	pdlCallRe  = regexp.MustCompile(`^(pdl_pf_\w+)(<[\w,:]*>)?\((.*)\);$`)
	identRe    = regexp.MustCompile(`^[A-Za-z_]\w*$`)
	intRe      = regexp.MustCompile(`^[0-9]+$`)
	asmRe      = regexp.MustCompile(`asm\s+volatile\s*\(\s*"([^"]*)"[^;]*;`)
	derefRe    = regexp.MustCompile(`(^|[=(,;{}+\-?:!&|<>])\s*\*\s*[A-Za-z_(]`)
	callNameRe = regexp.MustCompile(`\b([A-Za-z_]\w*)\s*(<[^<>;()]*>)?\s*\(`)
)

// paramTypes maps a kernel's parameter names to whether each is a pointer.
func paramTypes(params string) map[string]bool {
	out := map[string]bool{}
	for _, p := range splitArgs(params) {
		m := nameRe.FindStringSubmatch(p)
		if m != nil {
			out[m[1]] = strings.Contains(p, "*")
		}
	}
	return out
}

// checkPDLEntry says why a listed kernel's definition may not be launched
// programmatically: it must begin with PDL_WAIT(), or with calls of the
// prefetch helpers whose arguments are the kernel's weight parameters,
// its scalar parameters or integer constants, followed by
// PDL_WAIT_LATE(p >= 0) on a scalar p.
func checkPDLEntry(name string, d kernelDef, weights map[string][]string) error {
	if len(d.stmts) > 0 && d.stmts[0] == pdlEntry {
		return nil
	}
	params := paramTypes(d.params)
	var allowed []string
	for pre, ws := range weights {
		if strings.HasPrefix(name, pre) {
			allowed = ws
		}
	}
	for i, st := range d.stmts {
		if m := pdlLateRe.FindStringSubmatch(st); m != nil {
			if ptr, ok := params[m[1]]; !ok || ptr {
				return fmt.Errorf("PDL_WAIT_LATE's argument %s is not a scalar parameter", m[1])
			}
			return nil
		}
		m := pdlCallRe.FindStringSubmatch(st)
		if m == nil || !slices.Contains(pdlHelpers, m[1]) {
			return fmt.Errorf("statement %d %q before the wait is not a prefetch helper call (PDL_WAIT() or PDL_WAIT_LATE(p >= 0) must come first)", i+1, st)
		}
		for _, a := range splitArgs(m[3]) {
			if intRe.MatchString(a) {
				continue // a constant
			}
			ptr, ok := params[a]
			if !identRe.MatchString(a) || !ok {
				return fmt.Errorf("prologue %s passes %q, not a parameter of the kernel", m[1], a)
			}
			if ptr && !slices.Contains(allowed, a) {
				return fmt.Errorf("prologue %s touches %s before the wait: only the weights (%s) may be prefetched", m[1], a, strings.Join(allowed, ", "))
			}
		}
	}
	return fmt.Errorf("no PDL_WAIT() or PDL_WAIT_LATE(p >= 0) among the first statements %q", d.stmts)
}

// helperBody returns the body of the device function name in src.
func helperBody(src, name string) (string, bool) {
	re := regexp.MustCompile(`__device__[^;{}]*\b` + name + `\s*\(`)
	loc := re.FindStringIndex(src)
	if loc == nil {
		return "", false
	}
	q := matchParen(src, loc[1]-1)
	if q < 0 {
		return "", false
	}
	b := strings.IndexByte(src[q:], '{')
	if b < 0 {
		return "", false
	}
	start, d := q+b, 0
	for i := start; i < len(src); i++ {
		switch src[i] {
		case '{':
			d++
		case '}':
			d--
			if d == 0 {
				return src[start+1 : i], true
			}
		}
	}
	return "", false
}

// checkPDLHelper says why a prologue helper's body could read or write
// memory: only prefetch.global.L2 asm, no indexing, member access through
// pointers, dereference or load intrinsic, and calls of pdlHelpers only.
func checkPDLHelper(body string) error {
	for _, m := range asmRe.FindAllStringSubmatch(body, -1) {
		if !strings.HasPrefix(strings.TrimSpace(m[1]), "prefetch.global.L2 ") {
			return fmt.Errorf("asm %q is not an L2 prefetch", m[1])
		}
	}
	rest := asmRe.ReplaceAllString(body, ";")
	for _, bad := range []string{"[", "->", "__ldg", "atomic", "asm"} {
		if strings.Contains(rest, bad) {
			return fmt.Errorf("%q in a prologue helper", bad)
		}
	}
	if derefRe.MatchString(rest) {
		return fmt.Errorf("a dereference (%q) in a prologue helper", derefRe.FindString(rest))
	}
	for _, m := range callNameRe.FindAllStringSubmatch(rest, -1) {
		switch m[1] {
		case "if", "for", "while", "return":
		default:
			if !slices.Contains(pdlHelpers, m[1]) {
				return fmt.Errorf("a prologue helper calls %s", m[1])
			}
		}
	}
	return nil
}

// Every kernel launched programmatically must start with PDL_WAIT(): see
// pdl.go for why a listed kernel without it would race.
func TestPDLKernelsWait(t *testing.T) {
	entries := kernelDefs(KernelSource())
	var names []string
	for n := range pdlKernels {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		defs, ok := entries[n]
		if !ok {
			t.Errorf("pdl.go lists %s, but no cu/*.cu defines that kernel", n)
			continue
		}
		for i, d := range defs {
			if err := checkPDLEntry(n, d, pdlWeightParams); err != nil {
				t.Errorf("kernel %s (definition %d of %d): %v; begin it with PDL_WAIT() (or a weight prefetch and PDL_WAIT_LATE) or take it off pdl.go's list", n, i+1, len(defs), err)
			}
		}
	}
	src := stripComments(KernelSource())
	for _, h := range pdlHelpers {
		body, ok := helperBody(src, h)
		if !ok {
			t.Errorf("prologue helper %s not found in the kernel source", h)
			continue
		}
		if err := checkPDLHelper(body); err != nil {
			t.Errorf("prologue helper %s: %v", h, err)
		}
	}
	var plain []string
	for n := range entries {
		if !pdlKernels[n] {
			plain = append(plain, n)
		}
	}
	sort.Strings(plain)
	t.Logf("%d kernels launched programmatically, %d plainly: %s", len(names), len(plain), strings.Join(plain, " "))
	common, err := kernelFS.ReadFile("cu/common.cuh")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(common), "griddepcontrol.wait;") {
		t.Errorf("common.cuh's PDL_WAIT no longer executes griddepcontrol.wait")
	}
}

// The parser itself: kernels written out, with __launch_bounds__, in
// kernel-defining macros with ## pasting, and under #if/#else.
func TestKernelEntries(t *testing.T) {
	src := `
// a comment with __global__ foo(
extern "C" __global__ void __launch_bounds__(128, 2) good(const float* x, /* (odd) */ int n) {
  PDL_WAIT();
  x[0] = 1;
}
extern "C" __global__ void bad(float* y) {
  y[0] = 0.0f;  // reads before no wait
  PDL_WAIT();
}
#define KERNELS(NAME, R)                               \
  extern "C" __global__ void __launch_bounds__(256)    \
      k_##NAME##_r##R(const float* x) {                 \
    PDL_WAIT();                                        \
    use<R>(x);                                         \
  }                                                    \
  extern "C" __global__ void late_##NAME(float* y) {   \
    int i = threadIdx.x;                               \
    PDL_WAIT();                                        \
  }
KERNELS(a, 1)
KERNELS(b, 4)
#if X
extern "C" __global__ void twice(int* p) { PDL_WAIT(); p[0] = 1; }
#else
extern "C" __global__ void twice(int* p) { __trap(); }
#endif
`
	got := kernelEntries(src)
	want := map[string][]string{
		"good":   {pdlEntry},
		"bad":    {"y[0]=0.0f;"},
		"k_a_r1": {pdlEntry},
		"k_b_r4": {pdlEntry},
		"late_a": {"inti=threadIdx.x;"},
		"late_b": {"inti=threadIdx.x;"},
		"twice":  {pdlEntry, "__trap();"},
	}
	if len(got) != len(want) {
		t.Errorf("found %d kernels %v, want %d", len(got), got, len(want))
	}
	for n, w := range want {
		g := got[n]
		if strings.Join(g, "|") != strings.Join(w, "|") {
			t.Errorf("kernel %s: first statements %q, want %q", n, g, w)
		}
	}
}

// The prologue check admits a weight prefetch before PDL_WAIT_LATE and
// fails for anything else before the wait, and the helper check fails for
// a helper that loads.
func TestPDLPrologueCheck(t *testing.T) {
	src := `
extern "C" __global__ void gemv_tile_ok(const float* x, const void* W0, const void* W1, int N, int pdl) {
  pdl_pf_tile<TFP8, 4>(W0, W1, N, pdl);
  PDL_WAIT_LATE(pdl >= 0);
  use(x);
}
extern "C" __global__ void gemv_tile_plain(const float* x, const void* W0) { PDL_WAIT(); use(x); }
extern "C" __global__ void gemv_tile_reads_x(const float* x, const void* W0, int N, int pdl) {
  pdl_pf_tile<TFP8, 4>(x, W0, N, pdl);
  PDL_WAIT_LATE(pdl >= 0);
}
extern "C" __global__ void gemv_group_not_helper(const float* x, const void* w0, int pdl) {
  float v = x[0];
  PDL_WAIT_LATE(pdl >= 0);
}
extern "C" __global__ void gemv_group_other_fn(const void* w0, int pdl) {
  my_loader(w0);
  PDL_WAIT_LATE(pdl >= 0);
}
extern "C" __global__ void gemv_group_expr(const void* w0, int pdl) {
  pdl_pf_range(w0 + 4, 0, pdl);
  PDL_WAIT_LATE(pdl >= 0);
}
extern "C" __global__ void other_kernel_w(const void* W0, int pdl) {
  pdl_pf_range(W0, 0, pdl);
  PDL_WAIT_LATE(pdl >= 0);
}
extern "C" __global__ void gemv_tile_ptr_late(const void* W0, const int* flag) {
  PDL_WAIT_LATE(flag >= 0);
}
extern "C" __global__ void gemv_tile_no_wait(const void* W0, int pdl) {
  pdl_pf_range(W0, 0, pdl);
  y[0] = 1;
}
`
	want := map[string]bool{"gemv_tile_ok": true, "gemv_tile_plain": true, "gemv_tile_reads_x": false,
		"gemv_group_not_helper": false, "gemv_group_other_fn": false, "gemv_group_expr": false,
		"other_kernel_w": false, "gemv_tile_ptr_late": false, "gemv_tile_no_wait": false}
	defs := kernelDefs(src)
	if len(defs) != len(want) {
		t.Fatalf("parsed %d kernels, want %d", len(defs), len(want))
	}
	for n, ok := range want {
		err := checkPDLEntry(n, defs[n][0], pdlWeightParams)
		if (err == nil) != ok {
			t.Errorf("%s: admitted %v (err %v), want %v", n, err == nil, err, ok)
		}
	}
	helpers := []struct {
		body string
		ok   bool
	}{
		{`const char* p = (const char*)w + off; for (long long o = threadIdx.x * 128; o < n; o += 128) asm volatile("prefetch.global.L2 [%0];" ::"l"(p + o));`, true},
		{`if (pdl <= 0) return; pdl_pf_range(W, r0 * rb, n);`, true},
		{`float v = p[0];`, false},
		{`float v = *p;`, false},
		{`x = __ldg(p);`, false},
		{`asm volatile("ld.global.u32 %0, [%1];" : "=r"(v) : "l"(p));`, false},
		{`v = s->n;`, false},
		{`load_row(p);`, false},
	}
	for _, h := range helpers {
		if err := checkPDLHelper(h.body); (err == nil) != h.ok {
			t.Errorf("helper %q: admitted %v (err %v), want %v", h.body, err == nil, err, h.ok)
		}
	}
}

// Modes 4 and 5 launch exactly the kernels that take the pdl argument
// programmatically: pdlBigKernels must be those.
func TestPDLBigKernels(t *testing.T) {
	defs := kernelDefs(KernelSource())
	for n := range pdlKernels {
		for _, d := range defs[n] {
			params := splitArgs(d.params)
			hasArg := len(params) > 0 && strings.Fields(params[len(params)-1])[len(strings.Fields(params[len(params)-1]))-1] == "pdl"
			if hasArg != pdlBigKernels[n] {
				t.Errorf("kernel %s: pdl argument %v, in pdlBigKernels %v", n, hasArg, pdlBigKernels[n])
			}
		}
	}
	if len(pdlBigKernels) < 60 {
		t.Errorf("only %d weight-streaming kernels found", len(pdlBigKernels))
	}
}
