package kernels

import (
	"bytes"
	"math/rand/v2"
	"testing"

	"github.com/tilert-go/tilert/cuda"
)

// l2_prefetch writes nothing: a buffer of random bytes is the same after
// launches over unaligned ranges of odd lengths, empty ones, a range that
// ends at the buffer's last byte and all 12 slots; bad ranges are refused
// before anything launches.
func TestKernelL2Prefetch(t *testing.T) {
	onGPU(t, func(c *cuda.Ctx, k *Set, a *allocs, r *rand.Rand) {
		s := c.Stream()
		const n = 24 << 20
		data := randBytes(r, n)
		p := a.up(data)
		off := r.Int64N(n / 2)
		rs := []L2Range{
			{p.Add(1), 1}, {p.Add(127), 129}, {p.Add(4096), 0}, {p.Add(5000), 17 << 20}, {0, 0},
			{p, n}, {p.Add(n - 3), 3}, {p.Add(off), r.Int64N(n / 2)}, {p.Add(128), 128},
			{p.Add(n / 3), 1 << 20}, {p.Add(255), 4097}, {p.Add(n - 128), 128},
		}
		for _, set := range [][]L2Range{rs[:1], rs[:3], rs[:8], rs} {
			chk(k.L2Prefetch(s, set))
		}
		chk(c.SyncStream(s))
		if got := downBytes(c, p, n); !bytes.Equal(got, data) {
			i := 0
			for i < n && got[i] == data[i] {
				i++
			}
			t.Errorf("l2_prefetch changed the buffer (first at byte %d)", i)
		}
		for _, bad := range [][]L2Range{nil, make([]L2Range, MaxL2Ranges+1), {{0, 5}}, {{p, -1}}} {
			if err := k.L2Prefetch(s, bad); err == nil {
				t.Errorf("L2Prefetch(%v) launched", bad)
			}
		}
		if g := L2PrefetchGrid([]L2Range{{p, 16_500_000}}); g < 16 || g > 132 {
			t.Errorf("grid for 16.5 MB: %d blocks", g)
		}
	})
}
