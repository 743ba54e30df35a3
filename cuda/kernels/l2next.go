package kernels

import (
	"github.com/cockroachdb/errors"

	"github.com/tilert-go/tilert/cuda"
)

// L2Range is a byte range of device memory for L2Prefetch.
type L2Range struct {
	P cuda.DevPtr
	N int64
}

// MaxL2Ranges bounds the ranges of one L2Prefetch launch (l2_prefetch's
// parameters).
const MaxL2Ranges = 12

// l2PrefetchLinesPerThread sizes l2_prefetch's grid: each thread issues
// about this many line prefetches, so ~17 MB (a layer's input projections)
// takes ~32 blocks, a sliver of the SMs beside the weight streams.
const l2PrefetchLinesPerThread = 16

// L2PrefetchGrid is l2_prefetch's block count for rs: enough blocks that
// each thread asks for ~l2PrefetchLinesPerThread lines, at most 132.
func L2PrefetchGrid(rs []L2Range) int {
	var lines int64
	for _, r := range rs {
		lines += (r.N + 127) / 128
	}
	per := int64(256 * l2PrefetchLinesPerThread)
	return int(max(1, min(132, (lines+per-1)/per)))
}

// L2Prefetch asks the L2 for the lines of rs (cu/l2next.cu) and returns;
// nothing is written. Empty ranges are skipped; a null pointer with bytes
// or a negative length is refused.
func (k *Set) L2Prefetch(s cuda.Stream, rs []L2Range) error {
	if len(rs) == 0 || len(rs) > MaxL2Ranges {
		return errors.Newf("l2_prefetch: %d ranges (1..%d)", len(rs), MaxL2Ranges)
	}
	args := make([]any, 0, 2*MaxL2Ranges)
	for i, r := range rs {
		if r.N < 0 || (r.P == 0 && r.N > 0) {
			return errors.Newf("l2_prefetch: range %d is %d bytes at %#x", i, r.N, uint64(r.P))
		}
		args = append(args, r.P, r.N)
	}
	for len(args) < 2*MaxL2Ranges {
		args = append(args, cuda.DevPtr(0), int64(0))
	}
	return k.launch("l2_prefetch", cuda.D1(L2PrefetchGrid(rs)), cuda.D1(256), 0, s, args...)
}
