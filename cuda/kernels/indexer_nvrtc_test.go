package kernels

import (
	"regexp"
	"slices"
	"strconv"
	"testing"

	"github.com/tilert-go/tilert/cuda"
)

// TestNVRTCIndexerScoresRegisters: the default module compiles with NVRTC
// for sm_90 (no GPU needed) and the serving scores kernels keep their
// occupancy: the _pf and _rows forms (launch bounds 256 threads, 2 blocks an
// SM) fit 128 registers without spilling, now that each warp also holds its
// next key group's scales (session 24).
func TestNVRTCIndexerScoresRegisters(t *testing.T) {
	nv, err := cuda.LoadNVRTC()
	if err != nil {
		t.Skipf("no NVRTC here, compile check skipped: %v", err)
	}
	if !slices.Contains(nv.SupportedArchs(), 90) {
		t.Skipf("NVRTC %s has no sm_90", nv.Version())
	}
	_, log, err := nv.CompileLog(KernelSource(), "tilert_kernels.cu", append(kernelOptions("sm_90"), "-Xptxas", "-v"), true)
	if err != nil {
		t.Skipf("NVRTC %s refused -Xptxas -v (registers not shown): %v", nv.Version(), err)
	}
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

var ptxasUsed = regexp.MustCompile(`Used (\d+) registers`)
var ptxasFunc = regexp.MustCompile(`Compiling entry function '([^']+)'`)

// ptxasRegisters reads each entry function's register count from a
// ptxas -v log.
func ptxasRegisters(log string) map[string]int {
	regs := map[string]int{}
	fn := ""
	for _, line := range regexp.MustCompile(`\r?\n`).Split(log, -1) {
		if m := ptxasFunc.FindStringSubmatch(line); m != nil {
			fn = m[1]
		}
		if m := ptxasUsed.FindStringSubmatch(line); m != nil && fn != "" {
			regs[fn], _ = strconv.Atoi(m[1])
		}
	}
	return regs
}
