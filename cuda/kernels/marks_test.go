package kernels

import (
	"regexp"
	"sort"
	"strconv"
	"strings"
	"testing"
)

// deviceBodies returns the top-level functions of src (comments,
// preprocessor lines and line continuations gone) by name, with their
// bodies: a '{' at depth 0 right after a parameter list.
func deviceBodies(src string) map[string][]string {
	s := strings.ReplaceAll(stripComments(src), "\\\n", " ")
	s = regexp.MustCompile(`(?m)^\s*#.*$`).ReplaceAllString(s, "")
	out := map[string][]string{}
	ident := regexp.MustCompile(`(\w+)\s*(<[^<>()]*>)?\s*$`)
	for i := 0; i < len(s); i++ {
		if s[i] != '{' {
			continue
		}
		end := matchBrace(s, i)
		if end < 0 {
			break
		}
		j := strings.TrimRight(s[:i], " \t\n")
		j = strings.TrimSuffix(j, "const")
		j = strings.TrimRight(j, " \t\n")
		if strings.HasSuffix(j, ")") {
			// The parameter list's '(' (its matching one, backwards).
			d, k := 0, len(j)-1
			for ; k >= 0; k-- {
				if j[k] == ')' {
					d++
				} else if j[k] == '(' {
					d--
					if d == 0 {
						break
					}
				}
			}
			if k > 0 {
				if m := ident.FindStringSubmatch(j[:k]); m != nil {
					out[m[1]] = append(out[m[1]], s[i+1:end])
				}
			}
		}
		i = end
	}
	return out
}

// TestBlockMarksReserved: BLOCK_MARK writes through the slot that
// PDL_WAIT_MARKED() reserves (common.cuh: a shared word no other kernel
// sets), so every kernel that reaches a mark, in its body or through the
// device functions that take them, must open with PDL_WAIT_MARKED(), and
// clocks.go must name its marks. A kernel that reached one without it would
// write a block-clock build's record through an unset word.
func TestBlockMarksReserved(t *testing.T) {
	srcs := []string{KernelSource(), AbsorbKernelSource(), FewKernelSource(), MidKernelSource(), WGKernelSource()}
	bodies := map[string][]string{}
	def := regexp.MustCompile(`(?m)^\s*#define\s+(\w+)(\([^)]*\))?(.*)$`)
	for _, src := range srcs {
		for n, bs := range deviceBodies(src) {
			bodies[n] = append(bodies[n], bs...)
		}
		// Macros count as functions (WGH_RUN calls wgh_body), but not
		// BLOCK_MARK's own definitions.
		for _, m := range def.FindAllStringSubmatch(strings.ReplaceAll(stripComments(src), "\\\n", " "), -1) {
			if m[1] != "BLOCK_MARK" {
				bodies[m[1]] = append(bodies[m[1]], m[3])
			}
		}
	}
	marked := map[string]bool{}
	for n, bs := range bodies {
		for _, b := range bs {
			if strings.Contains(b, "BLOCK_MARK(") {
				marked[n] = true
			}
		}
	}
	if len(marked) == 0 {
		t.Fatal("no function takes BLOCK_MARK: the parse found nothing (or the marks are gone: then drop this test)")
	}
	calls := func(b string) bool {
		for m := range marked {
			if regexp.MustCompile(`\b` + m + `\b`).MatchString(b) {
				return true
			}
		}
		return false
	}
	for changed := true; changed; {
		changed = false
		for n, bs := range bodies {
			if marked[n] {
				continue
			}
			for _, b := range bs {
				if calls(b) {
					marked[n], changed = true, true
					break
				}
			}
		}
	}
	var kernels []string
	for _, src := range srcs {
		for n, defs := range kernelDefs(src) {
			for _, d := range defs {
				reaches := strings.Contains(d.body, "BLOCK_MARK(") || calls(d.body)
				switch {
				case reaches && d.first != pdlEntryMarked:
					t.Errorf("kernel %s reaches a BLOCK_MARK but starts with %q: open it with PDL_WAIT_MARKED()", n, d.first)
				case reaches:
					kernels = append(kernels, n)
					if MarkLabels(n) == nil {
						t.Errorf("kernel %s takes marks, but clocks.go's markLabels names none for it", n)
					}
				case d.first == pdlEntryMarked:
					t.Errorf("kernel %s opens with PDL_WAIT_MARKED() but takes no mark: use PDL_WAIT()", n)
				}
			}
		}
	}
	for _, src := range srcs {
		for _, m := range regexp.MustCompile(`BLOCK_MARK\((\d+)\)`).FindAllStringSubmatch(stripComments(src), -1) {
			if i, _ := strconv.Atoi(m[1]); i >= MarksMax {
				t.Errorf("BLOCK_MARK(%d): a block takes marks 0..%d", i, MarksMax-1)
			}
		}
	}
	for _, n := range kernels {
		if l := MarkLabels(n); len(l) > MarksMax {
			t.Errorf("kernel %s: %d mark labels, more than the %d marks a block takes", n, len(l), MarksMax)
		}
	}
	sort.Strings(kernels)
	var fns []string
	for n := range marked {
		fns = append(fns, n)
	}
	sort.Strings(fns)
	for _, want := range []string{"topk_radix_one_w12", "indexer_scores_wgh2", "attn_epilogue_qs"} {
		if !strings.Contains(" "+strings.Join(kernels, " ")+" ", " "+want+" ") {
			t.Errorf("kernel %s takes no marks (the parse missed it?); marked kernels: %v", want, kernels)
		}
	}
	t.Logf("marked functions %v; kernels %v", fns, kernels)
}
