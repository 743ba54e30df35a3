package kernels

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/tilert-go/tilert/cuda"
)

// TestL2WarmSumRef pins the CPU reference's reading of the part: the first
// prefix bytes of every period, whole 16-byte words only.
func TestL2WarmSumRef(t *testing.T) {
	data := make([]byte, 80)
	for i := range data {
		data[i] = byte(i + 1)
	}
	word := func(off int) uint32 {
		return uint32(data[off]) | uint32(data[off+1])<<8 | uint32(data[off+2])<<16 | uint32(data[off+3])<<24
	}
	xor16 := func(off int) uint32 { return word(off) ^ word(off+4) ^ word(off+8) ^ word(off+12) }
	for _, c := range []struct {
		n              int
		period, prefix int64
		want           uint32
	}{
		{80, 16, 16, xor16(0) ^ xor16(16) ^ xor16(32) ^ xor16(48) ^ xor16(64)},
		{80, 32, 16, xor16(0) ^ xor16(32) ^ xor16(64)},
		{72, 32, 16, xor16(0) ^ xor16(32)}, // the last window's word is cut: not read
		{80, 64, 32, xor16(0) ^ xor16(16) ^ xor16(64)},
		{15, 16, 16, 0},
	} {
		if got := L2WarmSum(data[:c.n], c.period, c.prefix); got != c.want {
			t.Errorf("n=%d period=%d prefix=%d: %#x, want %#x", c.n, c.period, c.prefix, got, c.want)
		}
	}
}

// TestKernelL2Warm: l2_warm reads exactly the part asked (its XOR against
// the CPU reference's, on fresh random bytes) and writes nothing else.
func TestKernelL2Warm(t *testing.T) {
	onGPU(t, func(c *cuda.Ctx, k *Set, a *allocs, r *rand.Rand) {
		s := c.Stream()
		for _, cs := range []struct {
			n              int
			period, prefix int64
			blocks         int
		}{
			{7168 * 16384 / 64, 4096, 1024, 132}, // an o_proj-like spread, a 64th of the bytes
			{1 << 20, 4096, 4096, 7},             // the whole range
			{1<<20 + 48, 4096, 16, 1},            // one word a period; a partial last window
			{12345 * 16, 1 << 16, 4096, 300},     // more threads than words
			{100, 64, 48, 2},                     // the last window's word cut at n
		} {
			data := make([]byte, cs.n)
			for i := range data {
				data[i] = byte(r.Uint32())
			}
			p := a.up(data)
			sum := a.up([]uint32{0})
			chk(k.L2Warm(s, p, int64(cs.n), cs.period, cs.prefix, cs.blocks, sum))
			got := downI32(c, sum, 1)[0]
			tag := fmt.Sprintf("n=%d period=%d prefix=%d blocks=%d", cs.n, cs.period, cs.prefix, cs.blocks)
			want := L2WarmSum(data, cs.period, cs.prefix)
			record(t, "l2_warm xor vs CPU "+tag, "mismatched sums", float64(boolInt(uint32(got) != want)), 0)
			record(t, "l2_warm left its range as it was "+tag, "changed bytes", float64(boolInt(!bytes.Equal(downBytes(c, p, cs.n), data))), 0)
			// without a sum it only reads (nothing to check but that it runs)
			chk(k.L2Warm(s, p, int64(cs.n), cs.period, cs.prefix, cs.blocks, 0))
		}
		for _, bad := range []struct {
			p              cuda.DevPtr
			n              int64
			period, prefix int64
			blocks         int
		}{
			{0, 64, 16, 16, 1}, {a.raw(64) + 8, 32, 16, 16, 1}, {a.raw(64), 0, 16, 16, 1},
			{a.raw(64), 64, 24, 16, 1}, {a.raw(64), 64, 32, 48, 1}, {a.raw(64), 64, 32, 0, 1}, {a.raw(64), 64, 32, 16, 0},
		} {
			if err := k.L2Warm(s, bad.p, bad.n, bad.period, bad.prefix, bad.blocks, 0); err == nil {
				t.Errorf("L2Warm(%+v) took a bad call", bad)
			}
		}
	})
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}
