package kernels

import (
	"reflect"
	"testing"
)

// TestExpertTiles pins the grouped GEMM's tile cut: every pair in exactly
// one tile of its expert, in order; big tiles (<= GemmExpertBigRows) first,
// small ones (<= GemmTileRows) after.
func TestExpertTiles(t *testing.T) {
	rep := func(e int32, n int) []int32 {
		s := make([]int32, n)
		for i := range s {
			s[i] = e
		}
		return s
	}
	eid := append(append(append(rep(0, 300), rep(1, 64)...), rep(2, 65)...), rep(5, 1)...)
	for _, c := range []struct {
		big   bool
		tiles []int32
		nbig  int
	}{
		{false, []int32{0, 0, 64, 0, 64, 64, 0, 128, 64, 0, 192, 64, 0, 256, 44, 1, 300, 64, 2, 364, 64, 2, 428, 1, 5, 429, 1}, 0},
		{true, []int32{0, 0, 128, 0, 128, 128, 2, 364, 65, 0, 256, 44, 1, 300, 64, 5, 429, 1}, 3},
	} {
		tiles, nbig := ExpertTiles(eid, c.big)
		if !reflect.DeepEqual(tiles, c.tiles) || nbig != c.nbig {
			t.Errorf("big %v: tiles %v (%d big), want %v (%d big)", c.big, tiles, nbig, c.tiles, c.nbig)
		}
		seen := make([]int, len(eid))
		for i := 0; i < len(tiles); i += 3 {
			lim := GemmTileRows
			if i/3 < nbig {
				lim = GemmExpertBigRows
			}
			if tiles[i+2] <= 0 || int(tiles[i+2]) > lim {
				t.Errorf("big %v: tile %d holds %d pairs (1..%d)", c.big, i/3, tiles[i+2], lim)
			}
			for p := tiles[i+1]; p < tiles[i+1]+tiles[i+2]; p++ {
				seen[p]++
				if eid[p] != tiles[i] {
					t.Errorf("big %v: tile %d (expert %d) holds pair %d of expert %d", c.big, i/3, tiles[i], p, eid[p])
				}
			}
		}
		for p, n := range seen {
			if n != 1 {
				t.Errorf("big %v: pair %d in %d tiles", c.big, p, n)
			}
		}
	}
}
