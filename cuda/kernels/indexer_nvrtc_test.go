package kernels

import (
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/tilert-go/tilert/cuda"
)

// TestNVRTCIndexerScoresRegisters: the indexer's kernels (cu/indexer*.cu
// after the default module's headers and engine.cu, whose ue8m0_ceil_f32
// they call) compile with NVRTC for sm_90 (no GPU needed) and the serving
// scores kernels keep their occupancy: the _pf and _rows forms (launch
// bounds 256 threads, 2 blocks an SM) fit 128 registers without spilling,
// now that each warp also holds its next key group's scales (session 24).
func TestNVRTCIndexerScoresRegisters(t *testing.T) {
	src := moduleSource(kernelFS, "cu/indexer*.cu", append(slices.Clone(defaultHeaders), "cu/engine.cu")...)
	log, _ := ptxasLogSM90(t, src, "indexer.cu")
	sp, _ := ptxasSpills(log)
	regs := ptxasRegisters(log)
	for _, name := range []string{"indexer_scores_mma_pf", "indexer_scores_mma_rows"} {
		r, ok := regs[name]
		if !ok {
			t.Errorf("%s: not in ptxas -v's log", name)
			continue
		}
		t.Logf("%s: %d registers", name, r)
		if n, ok := sp[name]; ok {
			t.Errorf("%s spills (%s bytes of spill stores)", name, n)
		}
		if r > 128 {
			t.Errorf("%s: %d registers, over the 128 of two 256-thread blocks an SM", name, r)
		}
	}
}

// regLimit is a kernel's register bound in an NVRTC register check.
type regLimit struct {
	name string
	max  int
}

// checkRegisters fails for each kernel of limits that is missing from
// ptxas -v's log or over its bound, and logs each one's registers and
// spills (spills vary with the NVRTC version; they are not failures here).
func checkRegisters(t *testing.T, log, version string, limits []regLimit) {
	t.Helper()
	sp, _ := ptxasSpills(log)
	regs := ptxasRegisters(log)
	for _, k := range limits {
		n, ok := regs[k.name]
		switch {
		case !ok:
			t.Errorf("%s: not in ptxas -v's log", k.name)
		case n > k.max:
			t.Errorf("%s: %d registers, want at most %d", k.name, n, k.max)
		}
		if b, bad := sp[k.name]; bad {
			t.Logf("%s spills %s bytes (NVRTC %s)", k.name, b, version)
		}
		t.Logf("%s: %d registers (NVRTC %s)", k.name, n, version)
	}
}

// ptxasLogSM90 compiles src for sm_90 with NVRTC and ptxas -v and returns
// ptxas's log and the NVRTC version; the test skips where there is no NVRTC,
// no sm_90 in it, or it refuses -v (no GPU needed). A source that does not
// compile to PTX fails the test: only the -v build may be refused.
func ptxasLogSM90(t *testing.T, src, name string) (log, version string) {
	t.Helper()
	nv, err := cuda.LoadNVRTC()
	if err != nil {
		t.Skipf("no NVRTC here, compile check skipped: %v", err)
	}
	if !slices.Contains(nv.SupportedArchs(), 90) {
		t.Skipf("NVRTC %s has no sm_90", nv.Version())
	}
	_, log, err = nv.CompileLog(src, name, append(kernelOptions("sm_90"), "-Xptxas", "-v"), true)
	if err != nil {
		// Told apart only on failure (the PTX-only compile costs as much).
		if _, plog, perr := nv.CompileLog(src, name, kernelOptions("sm_90"), false); perr != nil {
			t.Fatalf("%s does not compile for sm_90 (NVRTC %s): %v\n%s", name, nv.Version(), perr, plog)
		}
		t.Skipf("NVRTC %s refused -Xptxas -v (registers not shown): %v", nv.Version(), err)
	}
	return log, nv.Version()
}

// ptxasRegisters reads each entry function's register count from a
// ptxas -v log (ptxasSpills' reading of the same log).
func ptxasRegisters(log string) map[string]int {
	regs := map[string]int{}
	for _, part := range strings.Split(log, "Compiling entry function '")[1:] {
		name, rest, _ := strings.Cut(part, "'")
		if _, after, ok := strings.Cut(rest, "Used "); ok {
			if n, err := strconv.Atoi(strings.Fields(after)[0]); err == nil {
				regs[name] = n
			}
		}
	}
	return regs
}

func TestPtxasRegisters(t *testing.T) {
	log := `ptxas info    : Compiling entry function 'a' for 'sm_90'
ptxas info    : Function properties for a
ptxas         .     0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 124 registers, used 1 barriers, 32768 bytes smem
ptxas info    : Compiling entry function 'b' for 'sm_90'
ptxas info    : Used 80 registers
ptxas info    : Compiling entry function 'c' for 'sm_90'
`
	got := ptxasRegisters(log)
	if len(got) != 2 || got["a"] != 124 || got["b"] != 80 {
		t.Fatalf("%v, want a: 124, b: 80 (c names no count)", got)
	}
}
