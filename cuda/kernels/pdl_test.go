package kernels

import (
	"fmt"
	"math/rand/v2"
	"os"
	"regexp"
	"sort"
	"strings"
	"testing"

	"github.com/cockroachdb/errors"
	"github.com/tilert-go/tilert/cuda"
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
func matchParen(s string, open int) int { return matchPair(s, open, '(', ')') }

// matchPair is the index of the close byte matching the open one at open
// (nesting counted), or -1.
func matchPair(s string, open int, o, c byte) int {
	d := 0
	for i := open; i < len(s); i++ {
		switch s[i] {
		case o:
			d++
		case c:
			d--
			if d == 0 {
				return i
			}
		}
	}
	return -1
}

// matchBrace is the index of the '}' closing the '{' at open, or -1.
func matchBrace(s string, open int) int { return matchPair(s, open, '{', '}') }

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
			out[n] = append(out[n], d.first)
		}
	}
	return out
}

// kernelDef is one definition of a kernel: its first statement (spaces
// removed) and its body's text.
type kernelDef struct{ first, body string }

// kernelDefs is kernelEntries with each definition's body.
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
		// Attributes with arguments before the name (__launch_bounds__,
		// __cluster_dims__, in either order).
		for {
			pre := strings.TrimSpace(s[i:p])
			if !strings.HasSuffix(pre, "__launch_bounds__") && !strings.HasSuffix(pre, "__cluster_dims__") {
				break
			}
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
		body := s[q+b+1:]
		first := body
		if e := strings.IndexAny(body, ";}"); e >= 0 {
			first = body[:e+1]
		}
		if e := matchBrace(s, q+b); e >= 0 {
			body = s[q+b+1 : e]
		}
		out[nm[1]] = append(out[nm[1]], kernelDef{first: strings.Join(strings.Fields(first), ""), body: body})
		off = q
	}
	return out
}

const pdlEntry = "PDL_WAIT();"

// pdlEntryMarked is PDL_WAIT() in a kernel that takes block marks
// (common.cuh: the same wait; before it, with block clocks, thread 0
// reserves the marks' records).
const pdlEntryMarked = "PDL_WAIT_MARKED();"

// Every kernel launched programmatically must start with PDL_WAIT(): see
// pdl.go for why a listed kernel without it would race.
func TestPDLKernelsWait(t *testing.T) {
	entries := kernelEntries(KernelSource())
	names := checkWaits(t, entries, pdlKernels, "pdl.go's list", false)
	var plain []string
	for n := range entries {
		if !pdlKernels[n] && !pdlWeightsFirst[n] {
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

// checkWaits fails for every kernel of list that entries lacks or whose
// definitions do not all begin with PDL_WAIT() (or, with stubs, a
// __trap() stub that reads nothing), and returns list's names sorted.
func checkWaits(t *testing.T, entries map[string][]string, list map[string]bool, what string, stubs bool) []string {
	t.Helper()
	var names []string
	for n := range list {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		defs, ok := entries[n]
		if !ok {
			t.Errorf("%s lists %s, but no module source defines that kernel", what, n)
			continue
		}
		for i, first := range defs {
			if first != pdlEntry && first != pdlEntryMarked && !(stubs && first == "__trap();") {
				t.Errorf("kernel %s (definition %d of %d) starts with %q, not PDL_WAIT(); add the wait as its first statement or take it off %s", n, i+1, len(defs), first, what)
			}
		}
	}
	return names
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

// TestPDLSwitch: TILERT_GPU_PDL takes unset, 0 (plain launches) and 1
// (programmatic launches); 2 (removed in session 9) and anything else is
// refused with a hint naming the values that work.
func TestPDLSwitch(t *testing.T) {
	for _, c := range []struct {
		v    string
		on   bool
		fail string // part of the error's message, "" where it is accepted
	}{
		{"", false, ""},
		{"0", false, ""},
		{"1", true, ""},
		{"2", false, "removed"},
		{"3", false, "not a launch mode"},
		{"true", false, "not a launch mode"},
		{" 1", false, "not a launch mode"},
	} {
		on, err := pdlSwitch(c.v)
		if c.fail == "" {
			if err != nil || on != c.on {
				t.Errorf("TILERT_GPU_PDL=%q: %v, %v; want %v, no error", c.v, on, err, c.on)
			}
			continue
		}
		if err == nil || on {
			t.Errorf("TILERT_GPU_PDL=%q: %v, %v; want an error", c.v, on, err)
			continue
		}
		if !strings.Contains(err.Error(), c.fail) {
			t.Errorf("TILERT_GPU_PDL=%q: error %q does not say %q", c.v, err, c.fail)
		}
		if h := errors.FlattenHints(err); !strings.Contains(h, "set it to 1") || !strings.Contains(h, "unset TILERT_GPU_PDL") {
			t.Errorf("TILERT_GPU_PDL=%q: hint %q does not name the accepted values", c.v, h)
		}
	}
}

// TestKernelPDLModeEnv (device): Load's Set launches programmatically
// exactly when TILERT_GPU_PDL=1 and the device can, so engine runs with
// the switch set do run that way.
func TestKernelPDLModeEnv(t *testing.T) {
	onGPU(t, func(c *cuda.Ctx, k *Set, a *allocs, r *rand.Rand) {
		want := os.Getenv("TILERT_GPU_PDL") == "1" && c.PDLSupported()
		t.Logf("TILERT_GPU_PDL=%q: programmatic %v (device supports it: %v)", os.Getenv("TILERT_GPU_PDL"), k.PDL(), c.PDLSupported())
		bad := 0.0
		if k.PDL() != want {
			bad = 1
		}
		record(t, fmt.Sprintf("pdl from TILERT_GPU_PDL=%q (want programmatic %v)", os.Getenv("TILERT_GPU_PDL"), want), "mismatch", bad, 0)
	})
}

// plainWGKernels: the sm_90a module's kernels decided plain (no
// PDL_WAIT; on neither list), so TestPDLMoreKernelsWait does not ask for
// them.
var plainWGKernels = setOf("mla_prefill_wg", "mla_prefill_wg2", "mla_decode_wg2", "mwg_probe")

// TestPDLMoreKernelsWait: every kernel TILERT_GPU_PDL_MORE=1 launches
// programmatically begins with PDL_WAIT() in every definition (a __trap()
// stub for an architecture without the kernel reads nothing), and every
// kernel of the extra modules is on pdl.go's list or pdlMoreKernels, so a
// new one is decided, not forgotten.
func TestPDLMoreKernelsWait(t *testing.T) {
	entries := map[string][]string{}
	extra := map[string]bool{}
	for i, src := range []string{KernelSource(), AbsorbKernelSource(), FewKernelSource(), MidKernelSource(), WGKernelSource()} {
		for n, defs := range kernelEntries(src) {
			entries[n] = append(entries[n], defs...)
			if i > 0 {
				extra[n] = true
			}
		}
	}
	for _, n := range checkWaits(t, entries, pdlMoreKernels, "pdlMoreKernels", true) {
		if pdlKernels[n] {
			t.Errorf("kernel %s is on both lists", n)
		}
	}
	for n := range extra {
		if plainWGKernels[n] {
			if pdlKernels[n] || pdlMoreKernels[n] {
				t.Errorf("kernel %s has no PDL_WAIT but is on a programmatic list", n)
			}
			continue
		}
		if !pdlKernels[n] && !pdlMoreKernels[n] {
			t.Errorf("extra-module kernel %s is on neither pdl.go's list nor pdlMoreKernels: decide how it launches", n)
		}
	}
	for _, c := range []struct {
		name, more, plain string
		want              bool
	}{
		{"gemv_tile_fp8_r8_m1_d16", "", "", true},
		{"gemv_tile_fp8_r8_m1_d16", "1", "gemv_tile_fp8", false},
		{"gemv_tile_bf16_r4_m8", "", "gemv_tile_fp8,moe_route", true},
		{"moe_route_rank", "", "gemv_tile_fp8,moe_route", false},
		{"absorb_q_fast_g4_r4", "", "", false},
		{"absorb_v_fast_rw4", "", "", true},
		{"mla_decode_tcf2", "", "", true},
		{"gemv_mid_group_r4_m1_d16n", "", "", true},
		{"topk_fast16", "", "", false},
		{"mla_decode_tcf2", "0", "", false},
		{"absorb_q_fast_g4_r4", "0", "", false},
		{"absorb_q_fast_g4_r4", "1", "", true},
		{"absorb_q_fast_g4_r4", "absorb_v,mla_decode_tcf2", "", false},
		{"absorb_v_fast_rw4", "absorb_v, mla_decode_tcf2", "", true},
		{"mla_decode_tcf2", "1", "", true},
		{"mla_decode_tcf2", "mla_decode_tcf2", "", true},
		{"allreduce_oneshot_f32", "1", "", false},
		{"gemv_tile_fp8_r8_m1_d16s", "", "", false}, // SpreadPlan's o_proj: plain by default (session 15 call C)
		{"gemv_tile_fp8_r8_m1_d16s", "gemv_tile_fp8_r8_m1_d16s", "", true},
	} {
		sel, err := parsePDLSel(c.more, c.plain)
		if err != nil {
			t.Fatalf("TILERT_GPU_PDL_MORE=%q TILERT_GPU_PDL_PLAIN=%q: %v", c.more, c.plain, err)
		}
		prev := pdlSel
		pdlSel = sel
		if got := pdlFor(c.name); got != c.want {
			t.Errorf("pdlFor(%s) with TILERT_GPU_PDL_MORE=%q TILERT_GPU_PDL_PLAIN=%q = %v, want %v", c.name, c.more, c.plain, got, c.want)
		}
		pdlSel = prev
	}
	for _, c := range []struct{ more, plain string }{
		{"absorb_x", ""}, {"gemv_tile_bf16", ""}, {"", "absorb_q_fast"}, {"", "nonsense"}, {"2", ""},
	} {
		_, err := parsePDLSel(c.more, c.plain)
		if err == nil || len(errors.GetAllHints(err)) == 0 {
			t.Errorf("TILERT_GPU_PDL_MORE=%q TILERT_GPU_PDL_PLAIN=%q: error %v, want one with a hint", c.more, c.plain, err)
		}
	}
}

// SetPlain holds every launch plain and gives back what it replaced; off,
// launches are as pdlFor says (and plain without PDL whatever it holds).
func TestSetPlainHold(t *testing.T) {
	for _, pdl := range []bool{false, true} {
		k := &Set{pdl: pdl}
		const listed, unlisted = "gemv_tile_fp8_r8_m1_d16", "allreduce_oneshot_f32"
		if got := k.programmatic(listed); got != pdl {
			t.Errorf("pdl=%v: %s programmatic %v before any hold", pdl, listed, got)
		}
		if prev := k.SetPlain(true); prev {
			t.Errorf("pdl=%v: SetPlain(true) replaced a hold", pdl)
		}
		if k.programmatic(listed) || k.programmatic(unlisted) || !k.Plain() {
			t.Errorf("pdl=%v: a launch is programmatic under the hold", pdl)
		}
		if prev := k.SetPlain(false); !prev {
			t.Errorf("pdl=%v: SetPlain(false) did not report the hold it lifted", pdl)
		}
		if got := k.programmatic(listed); got != pdl || k.programmatic(unlisted) {
			t.Errorf("pdl=%v: after the hold %s programmatic %v, %s %v", pdl, listed, got, unlisted, k.programmatic(unlisted))
		}
	}
}
