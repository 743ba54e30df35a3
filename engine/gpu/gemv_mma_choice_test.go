package gpu

import "testing"

// TestMMARule pins which GEMVs take the tensor-core kernels by default and
// under the TILERT_GPU_GEMV_MMA spellings: 2..8 rows of matrices with at
// least 2048 rows, at 2 rows only short fp8 rows and bf16 (where the H200
// run timed them faster), never 1 row.
func TestMMARule(t *testing.T) {
	defer func(on, all bool) { gemvMMAOn, gemvMMAAll = on, all }(gemvMMAOn, gemvMMAAll)
	cases := []struct {
		on, all      bool
		N, kbytes, M int
		bf16         bool
		want         bool
	}{
		{true, false, 7168, 16384, 4, false, true},   // o_proj, 4 slots
		{true, false, 7168, 16384, 2, false, false},  // o_proj, MTP: the tile kernel is faster
		{true, false, 7168, 16384, 1, false, false},  // one row: the tile kernel
		{true, false, 24576, 1536, 2, false, true},   // q_b, MTP
		{true, false, 8192, 1536, 3, false, true},    // indexer wq_b
		{true, false, 129280, 14336, 2, true, true},  // head, MTP
		{true, false, 18432, 7168, 2, false, false},  // dense gate/up, MTP
		{true, false, 18432, 7168, 8, false, true},   // dense gate/up, 4 slots x MTP
		{true, false, 256, 14336, 4, true, false},    // router: too few rows
		{true, false, 1024, 320, 4, true, false},     // tiny head
		{true, true, 1024, 320, 2, true, true},       // =all: every shape
		{true, true, 160, 128, 1, false, false},      // =all, one row
		{false, false, 7168, 16384, 4, false, false}, // =0
	}
	for _, c := range cases {
		gemvMMAOn, gemvMMAAll = c.on, c.all
		if got := mmaRule(c.N, c.kbytes, c.M, c.bf16); got != c.want {
			t.Errorf("on=%v all=%v N=%d kbytes=%d M=%d bf16=%v: %v, want %v", c.on, c.all, c.N, c.kbytes, c.M, c.bf16, got, c.want)
		}
	}
}

// TestGroupMinM: the attention-input group takes the tensor cores from 2
// rows by default (session 19: the MTP step's 2 rows measured faster with
// it on u4), from 3 or 1 only where a switch asks.
func TestGroupMinM(t *testing.T) {
	for _, c := range []struct {
		mode string
		want int
	}{{"", 2}, {"1", 2}, {"all", 2}, {"g", 2}, {"g1", 1}, {"g3", 3}, {"u2", 3}} {
		if got := groupMinM(c.mode); got != c.want {
			t.Errorf("TILERT_GPU_GEMV_MMA=%q: group from %d rows, want %d", c.mode, got, c.want)
		}
	}
}
