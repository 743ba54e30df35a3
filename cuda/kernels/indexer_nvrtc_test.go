package kernels

import (
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/cockroachdb/errors"

	"github.com/tilert-go/tilert/cuda"
)

// TestNVRTCIndexerScoresRegisters: the indexer's kernels (cu/indexer*.cu
// after the default module's headers and engine.cu, whose ue8m0_ceil_f32
// they call) compile with NVRTC for sm_90 (no GPU needed) and the serving
// scores kernels keep their occupancy: the _pf and _rows forms (launch
// bounds 256 threads, 2 blocks an SM) fit 128 registers without spilling,
// now that each warp also holds its next key group's scales (session 24).
func TestNVRTCIndexerScoresRegisters(t *testing.T) {
	nv, err := cuda.LoadNVRTC()
	if err != nil {
		t.Skipf("no NVRTC here, compile check skipped: %v", err)
	}
	if !slices.Contains(nv.SupportedArchs(), 90) {
		t.Skipf("NVRTC %s has no sm_90", nv.Version())
	}
	src := moduleSource(kernelFS, "cu/indexer*.cu", append(slices.Clone(defaultHeaders), "cu/engine.cu")...)
	_, log, err := nv.CompileLog(src, "indexer.cu", append(kernelOptions("sm_90"), "-Xptxas", "-v"), true)
	if err != nil {
		t.Skipf("NVRTC %s refused -Xptxas -v (registers not shown): %v", nv.Version(), err)
	}
	sp, _ := ptxasSpills(log)
	regs := ptxasRegisters(log)
	// Blocks an SM each kernel must keep (256 threads): two for the
	// serving forms and _cp, one for the two-groups-a-warp _cp2.
	for _, k := range []struct {
		name   string
		blocks int
	}{
		{"indexer_scores_mma_pf", 2}, {"indexer_scores_mma_rows", 2}, {"indexer_scores_mma_cp", 2},
		{"indexer_scores_mma_rows_cp", 2}, {"indexer_scores_mma_cp2", 1}, {"indexer_scores_mma_rows_cp2", 1},
	} {
		r, ok := regs[k.name]
		if !ok {
			t.Errorf("%s: not in ptxas -v's log", k.name)
			continue
		}
		t.Logf("%s: %d registers", k.name, r)
		if n, ok := sp[k.name]; ok {
			t.Errorf("%s spills (%s bytes of spill stores)", k.name, n)
		}
		if most := 65536 / (256 * k.blocks); r > most {
			t.Errorf("%s: %d registers, over the %d of %d 256-thread blocks an SM", k.name, r, most, k.blocks)
		}
	}
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

func TestParseIdxCP(t *testing.T) {
	for _, c := range []struct {
		in   string
		want int
		bad  bool
	}{{"", 0, false}, {"0", 0, false}, {"1", 1, false}, {"2", 2, false}, {"3", 0, true}, {"on", 0, true}} {
		got, err := ParseIdxCP(c.in)
		if (err != nil) != c.bad || got != c.want {
			t.Errorf("%q: %d, %v; want %d (error %v)", c.in, got, err, c.want, c.bad)
		}
		if err != nil && (!strings.Contains(err.Error(), c.in) || len(errors.GetAllHints(err)) == 0) {
			t.Errorf("%q: error %v should name the value and carry a hint", c.in, err)
		}
	}
}

// indexerPairBlocks: _cp2's grid is one wave (a block an SM, nq rows of
// blocks) that covers every group pair of a row, as the kernel's warp loop
// takes pairs b*8 + w + r*8*nbx.
func TestIndexerPairBlocks(t *testing.T) {
	for _, sms := range []int{132, 78, 8, 1} {
		for _, nq := range []int{1, 2, 4, 8} {
			for _, T := range []int{16, 100, 8192, 32769, 131072, 140000, 163840} {
				nbx := indexerPairBlocks(sms, nq, T)
				pairs := cdiv(cdiv(T, 16), 2)
				if nbx < 1 || nbx > pairs && nbx > 1 {
					t.Errorf("sms %d, %d rows, T %d: %d blocks for %d pairs", sms, nq, T, nbx, pairs)
				}
				if nbx*nq > max(sms, nq) {
					t.Errorf("sms %d, %d rows, T %d: %d blocks a row is over one wave", sms, nq, T, nbx)
				}
			}
		}
	}
}
