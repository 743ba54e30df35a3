package kernels

import (
	"github.com/cockroachdb/errors"

	"github.com/tilert-go/tilert/cuda"
)

// AllReduceOneShot sums n float32 across nranks buffers in one launch:
// table holds the nranks device pointers (each addressable from this
// device); every buffer ends with the sum, added in rank order.
func (k *Set) AllReduceOneShot(s cuda.Stream, table cuda.DevPtr, nranks, n int) error {
	if nranks < 1 || n <= 0 {
		return errors.Newf("allreduce_oneshot: nranks=%d n=%d", nranks, n)
	}
	return k.launch("allreduce_oneshot_f32", cuda.D1(min(cdiv(n, 256), 1024)), cuda.D1(256), 0, s, table, int32(nranks), int64(n))
}

// CommMaxSlots is the number of barrier slots of a PeerBarrier's flag
// array: one per block of the largest grid a barrier launch uses.
const CommMaxSlots = 1024

// PeerBarrier makes a launch wait, on the device, until every rank's launch
// of the same call has started (ranks on different GPUs, flags in
// peer-mapped memory). Flags is this rank's array of CommMaxSlots x Ranks
// uint32 (zeroed before the first use, in its own memory); Table holds the
// Ranks device pointers of every rank's array as this device maps them.
// The zero value (Flags 0) is no barrier: ranks on one device are ordered
// by their stream.
type PeerBarrier struct {
	Flags, Table cuda.DevPtr
	Rank, Ranks  int
}

// PeerFlagBytes is the size of one rank's flag array for ranks ranks.
func PeerFlagBytes(ranks int) int64 { return 4 * int64(CommMaxSlots) * int64(ranks) }

func (b PeerBarrier) check(nranks int) error {
	if b.Flags == 0 {
		return nil
	}
	if b.Table == 0 || b.Ranks != nranks || b.Rank < 0 || b.Rank >= nranks {
		return errors.Newf("peer barrier: rank %d of %d, %d buffers", b.Rank, b.Ranks, nranks)
	}
	return nil
}

// AllReduceAddRMSNorm is the all-reduce fused with the residual add and
// RMSNorm after it, one block per row: s = the rank-order sum of the nranks
// partial buffers listed in parts (rows x D float32 each), then for each of
// the nout (x, h, w) pointer triples listed in outs: x += s, h =
// x*rsqrt(mean(x^2)+eps)*w. Bit-identical to AllReduceOneShot followed by
// AddRMSNorm. Ranks on one device: one launch, every rank's triple, no
// barrier. Ranks on several GPUs: each rank its own triple, parts
// peer-mapped, with bar.
func (k *Set) AllReduceAddRMSNorm(s cuda.Stream, parts cuda.DevPtr, nranks int, outs cuda.DevPtr, nout, rows, D int, eps float32, bar PeerBarrier) error {
	if nranks < 1 || nout < 1 || rows <= 0 || D <= 0 || rows > CommMaxSlots {
		return errors.Newf("allreduce_add_rmsnorm: nranks=%d nout=%d rows=%d D=%d", nranks, nout, rows, D)
	}
	if err := bar.check(nranks); err != nil {
		return err
	}
	return k.launch("allreduce_add_rmsnorm", cuda.D1(rows), cuda.D1(normThreads(D)), 0, s,
		parts, int32(nranks), outs, int32(nout), int32(D), eps, bar.Flags, bar.Table, int32(bar.Rank))
}

// AllReduceTo writes the rank-order sum of the nranks buffers listed in
// parts (n float32 each, unchanged) into out, after bar when set.
func (k *Set) AllReduceTo(s cuda.Stream, parts cuda.DevPtr, nranks int, out cuda.DevPtr, n int, bar PeerBarrier) error {
	if nranks < 1 || n <= 0 {
		return errors.Newf("allreduce_to: nranks=%d n=%d", nranks, n)
	}
	if err := bar.check(nranks); err != nil {
		return err
	}
	return k.launch("allreduce_to_f32", cuda.D1(min(cdiv(n, 256), CommMaxSlots)), cuda.D1(256), 0, s,
		parts, int32(nranks), out, int64(n), bar.Flags, bar.Table, int32(bar.Rank))
}

// BroadcastFrom copies nbytes (a multiple of 4) from src, another rank's
// peer-mapped buffer, into dst after bar.
func (k *Set) BroadcastFrom(s cuda.Stream, src, dst cuda.DevPtr, nbytes int64, bar PeerBarrier) error {
	if nbytes <= 0 || nbytes%4 != 0 {
		return errors.Newf("broadcast_from: %d bytes (a positive multiple of 4)", nbytes)
	}
	n := nbytes / 4
	return k.launch("broadcast_from_u32", cuda.D1(int(min((n+255)/256, CommMaxSlots))), cuda.D1(256), 0, s,
		src, dst, n, int32(max(bar.Ranks, 1)), bar.Flags, bar.Table, int32(bar.Rank))
}
