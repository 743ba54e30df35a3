package kernels

import (
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/cockroachdb/errors"

	"github.com/tilert-go/tilert/cuda"
)

// The split plan of a grouped GEMV (cu/gemv_group_split.cu): one input row,
// no norm, each block's weights copied into shared memory at once, each
// segment's group size G kept (so its sums), rows per group R sized to the
// shared memory. Issue 10: the layer input's 2304 x 7168 group measured
// 9.70 us graph-timed on gemv_group against 5.24 for a copy of its bytes.

// GroupSplitSmem is the shared memory a split block's weights (and scale
// rows) take at most by default: 28 KiB at K = 7168 with 4 fp8 rows or 2
// bf16 rows a block, so seven blocks fit an SM and the layer input's 592
// blocks one wave.
const GroupSplitSmem = 32 << 10

// GroupSplitMaxRows is the most rows a split group takes by default.
const GroupSplitMaxRows = 4

// groupSplitSMBytes: the split plan takes launches of at most this many
// weight bytes an SM (one wave of blocks in flight at once: 7 of 29 KiB).
const groupSplitSMBytes = 192 << 10

// forceSplitSmem and forceSplitR override GroupSplitSmem and
// GroupSplitMaxRows (timing sweeps; 0: the defaults).
var forceSplitSmem, forceSplitR int

// splitShape is one segment's split plan: G, the rows a group R, the
// blocks and the shared memory a block.
type splitShape struct{ G, R, Blocks, Smem int }

// groupSplitPlan is the split launch of segs over K (one row, no norm) on
// sms SMs with at most smemMax bytes of shared memory and rmax rows a group:
// every segment's shape, the launch's R bound (the kernel variant), blocks
// and shared memory. ok is false where the split kernel does not take it
// (a segment's one row a group over the shared memory, or more bytes than
// one wave holds).
func groupSplitPlan(sms, K int, segs []GroupSeg, smemMax, rmax int) (shapes []splitShape, rm, blocks, smem int, ok bool) {
	var bytes int64
	for _, sg := range segs {
		esize := 1
		if sg.BF16 {
			esize = 2
		}
		kbytes := K * esize
		bytes += int64(sg.N) * int64(kbytes)
		G, _ := groupShape(sms, sg, K, 1)
		groups := tileThreads / G
		scales := 0
		if !sg.BF16 {
			scales = groups * 4 * cdiv(K, 128)
		}
		R := 0
		for r := rmax; r >= 1; r /= 2 {
			if groups*r*kbytes+scales <= smemMax {
				R = r
				break
			}
		}
		if R == 0 {
			return nil, 0, 0, 0, false
		}
		sh := splitShape{G: G, R: R, Blocks: cdiv(cdiv(sg.N, R), groups), Smem: groups*R*kbytes + scales}
		shapes = append(shapes, sh)
		rm, blocks, smem = max(rm, R), blocks+sh.Blocks, max(smem, sh.Smem)
	}
	if len(segs) == 0 || bytes > int64(max(1, sms))*groupSplitSMBytes {
		return nil, 0, 0, 0, false
	}
	return shapes, rm, blocks, smem, true
}

// splitRMax is the kernel variant for a launch whose largest R is r.
func splitRMax(r int) int {
	for _, v := range []int{1, 2, 4, 8} {
		if r <= v {
			return v
		}
	}
	return 8
}

// GroupSplitOK says whether GemvGroupSplit runs the split kernel for the
// launch (else it runs GemvGroup): one input row, no norm, the shapes
// GroupOK takes, and groupSplitPlan's.
func (k *Set) GroupSplitOK(x cuda.DevPtr, K, M, ldx int, segs []GroupSeg, norm GroupNorm) bool {
	if M != 1 || norm.W != 0 || K <= 0 || ldx < K || !GroupOK(x, K, ldx, segs) {
		return false
	}
	_, _, _, _, ok := groupSplitPlan(k.c.Info().SMs, K, segs, splitSmem(), splitR())
	return ok
}

func splitSmem() int {
	if f := forceSplitSmem; f > 0 {
		return f
	}
	return GroupSplitSmem
}

func splitR() int {
	if f := forceSplitR; f == 1 || f == 2 || f == 4 || f == 8 {
		return f
	}
	return GroupSplitMaxRows
}

// GroupSplitLaunches counts launches that ran a gemv_group_split kernel
// (tests).
var GroupSplitLaunches atomic.Int64

// splitShared holds the split kernels' dynamic shared memory limits set
// (above 48 KiB).
var splitShared sync.Map

// GemvGroupSplit is GemvGroup on the split kernel (gemv_group_split_r*)
// where GroupSplitOK: every segment's output bit for bit GemvGroup's (each
// keeps its group size G, so each thread's chunks, their order and the
// combine); elsewhere GemvGroup. It reports whether the split kernel ran.
func (k *Set) GemvGroupSplit(s cuda.Stream, x cuda.DevPtr, K, M, ldx int, segs []GroupSeg, norm GroupNorm) (bool, error) {
	if !k.GroupSplitOK(x, K, M, ldx, segs, norm) {
		return false, k.GemvGroup(s, x, K, M, ldx, segs, norm)
	}
	if err := groupArgsErr(x, K, M, ldx, segs); err != nil {
		return false, err
	}
	shapes, rm, blocks, smem, _ := groupSplitPlan(k.c.Info().SMs, K, segs, splitSmem(), splitR())
	f, err := k.fn(fmt.Sprintf("gemv_group_split_r%d", splitRMax(rm)))
	if err != nil {
		return false, err
	}
	// The driver picks each launch's shared-memory carveout for the most
	// blocks an SM (no preference set: the L1 left over keeps x, which
	// every block reads, near its SM).
	if v, ok := splitShared.Load(f); smem > 48<<10 && (!ok || v.(int) < smem) {
		if err := k.c.SetMaxDynamicShared(f, smem); err != nil {
			return false, errors.WithHint(err, "the split grouped GEMV's shared memory is over the device's: lower forceSplitSmem, or set TILERT_GPU_GROUP_SPLIT=0")
		}
		splitShared.Store(f, smem)
	}
	args := make([]any, 0, 22)
	args = append(args, x, K)
	for i := range MaxGroupSegs {
		if i >= len(segs) {
			args = append(args, cuda.DevPtr(0), cuda.DevPtr(0), cuda.DevPtr(0), 0, 0)
			continue
		}
		sg, sh := segs[i], shapes[i]
		args = append(args, sg.W, sg.S, sg.Y, sg.N, sh.G|b2i(sg.BF16)<<14|sh.R<<16)
	}
	if err := k.launchFn(f, cuda.D1(blocks), cuda.D1(tileThreads), smem, s, args...); err != nil {
		return false, err
	}
	GroupSplitLaunches.Add(1)
	return true, nil
}

// groupArgsErr is GemvGroup's argument check.
func groupArgsErr(x cuda.DevPtr, K, M, ldx int, segs []GroupSeg) error {
	if K <= 0 || M <= 0 || M > MaxTileM || ldx < K {
		return errors.WithHint(errors.Newf("gemv group: K=%d M=%d ldx=%d (M must be 1..%d, ldx >= K)", K, M, ldx, MaxTileM),
			"split the rows into launches of at most MaxTileM")
	}
	if !GroupOK(x, K, ldx, segs) {
		return errors.WithHint(errors.Newf("gemv group: %d segments, K=%d ldx=%d x=%#x: needs 1..%d segments, K*esize %% 16 == 0, ldx %% 4 == 0, aligned x and weights",
			len(segs), K, ldx, uint64(x), MaxGroupSegs), "check GroupOK first and run the separate GEMVs where it says no")
	}
	for i, sg := range segs {
		if sg.N <= 0 || sg.Y == 0 || sg.W == 0 || (M > 1 && sg.LdY < sg.N) || (!sg.BF16 && sg.S == 0) {
			return errors.WithHint(errors.Newf("gemv group: segment %d: N=%d LdY=%d W=%#x S=%#x Y=%#x (fp8 needs scales; M > 1 needs LdY >= N)",
				i, sg.N, sg.LdY, uint64(sg.W), uint64(sg.S), uint64(sg.Y)), "give every segment rows, weights, an output and (fp8) its block scales")
		}
		if x < sg.Y+cuda.DevPtr(4*((M-1)*sg.LdY+sg.N)) && sg.Y < x+cuda.DevPtr(4*((M-1)*ldx+K)) {
			return errors.WithHint(errors.Newf("gemv group: segment %d's output overlaps the input", i), "write the outputs outside x")
		}
	}
	return nil
}
