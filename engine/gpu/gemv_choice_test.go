package gpu

import "testing"

// TestGemvWideChoice pins the shape rule and the TILERT_GPU_GEMV_WIDE
// spellings: small matrices wide by default, 0 and 1 force either side.
func TestGemvWideChoice(t *testing.T) {
	defer func(m string) { gemvWideMode = m }(gemvWideMode)
	cases := []struct {
		mode string
		rows int
		want bool
	}{
		{"", 256, true}, {"", 576, true}, {"", 1024, true}, {"", 1536, false}, {"", 8 * 2048, false},
		{"0", 256, false}, {"1", 18432, true}, {"auto", 64, true}, {"auto", 7168, false},
	}
	for _, c := range cases {
		gemvWideMode = c.mode
		if got := gemvWide(c.rows); got != c.want {
			t.Errorf("TILERT_GPU_GEMV_WIDE=%q rows %d: wide %v, want %v", c.mode, c.rows, got, c.want)
		}
	}
}

// TestTileRuleOf pins the TILERT_GPU_GEMV_TILE spellings of the tile rules.
func TestTileRuleOf(t *testing.T) {
	for mode, want := range map[string]int{"": 0, "0": 0, "1": 1, "2": 2, "3": 3, "4": 0, "on": 0} {
		if got := tileRuleOf(mode); got != want {
			t.Errorf("TILERT_GPU_GEMV_TILE=%q: rule %d, want %d", mode, got, want)
		}
	}
}
