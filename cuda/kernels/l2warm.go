package kernels

import (
	"github.com/cockroachdb/errors"

	"github.com/tilert-go/tilert/cuda"
)

// L2WarmThreads is l2_warm's block size.
const L2WarmThreads = 256

// L2Warm queues l2_warm (cu/l2warm.cu): blocks x 256 threads read the first
// prefix bytes of every period bytes of [p, p+n) so that those lines are in
// the L2 when a later kernel streams the range; nothing is written but the
// XOR of every 32-bit word read into *sum when sum != 0 (tests). The grid
// sets the rate it asks the HBM at (four 16-byte loads in flight a thread).
func (k *Set) L2Warm(s cuda.Stream, p cuda.DevPtr, n, period, prefix int64, blocks int, sum cuda.DevPtr) error {
	switch {
	case p == 0 || p%16 != 0:
		return errors.Newf("l2_warm: range at %#x: want a non-null 16-byte aligned pointer", uint64(p))
	case n <= 0:
		return errors.Newf("l2_warm: %d bytes: want at least one", n)
	case period < 16 || period%16 != 0 || prefix < 16 || prefix%16 != 0 || prefix > period:
		return errors.Newf("l2_warm: the first %d of every %d bytes: want multiples of 16 with 16 <= prefix <= period", prefix, period)
	case blocks < 1 || blocks > 65535:
		return errors.Newf("l2_warm: %d blocks: want 1..65535", blocks)
	}
	return k.launch("l2_warm", cuda.D1(blocks), cuda.D1(L2WarmThreads), 0, s, p, n, period, prefix, sum)
}

// L2WarmSum is what l2_warm writes into *sum for data (the CPU reference):
// the XOR of the 32-bit little-endian words of the first prefix bytes of
// every period bytes, the last window cut at whole 16-byte words.
func L2WarmSum(data []byte, period, prefix int64) uint32 {
	var x uint32
	n := int64(len(data))
	for w := int64(0); w < n; w += period {
		for q := w; q < w+prefix && q+16 <= n; q += 16 {
			for off := q; off < q+16; off += 4 {
				x ^= uint32(data[off]) | uint32(data[off+1])<<8 | uint32(data[off+2])<<16 | uint32(data[off+3])<<24
			}
		}
	}
	return x
}
