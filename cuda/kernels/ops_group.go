package kernels

import (
	"fmt"
	"strings"
	"sync/atomic"

	"github.com/cockroachdb/errors"

	"github.com/tilert-go/tilert/cuda"
)

// Grouped GEMVs (gemv_tile_group.cu): the projections of one input in one
// launch, so that several small latency-bound GEMVs fill the SMs together.

// MaxGroupSegs is the most projections one grouped launch takes.
const MaxGroupSegs = 4

// GroupSeg is one projection of a grouped GEMV: y[m][n] = W[n] . x[m] for
// n < N, W fp8 [N][K] with 128x128 block scales S, or bf16 [N][K] (BF16, S
// unused); output row m at Y + m*LdY.
//
// OutW and SumSq (segment 0 only, one input row, no GroupNorm; both or
// neither; TILERT_GPU_QA_NORM=late): the segment's row n is written times
// OutW[n] (float32 [N], q_a_layernorm's weight), and each of its
// GroupSumSqBlocks blocks stores the sum of its rows' squares (taken
// before OutW, rows in order) at SumSq[b]: RMSNorm(y) is then the written
// row times rsqrt(sum(SumSq) / N + eps), which absorb_q applies (QScale)
// instead of a norm launch.
type GroupSeg struct {
	W, S, Y cuda.DevPtr
	N, LdY  int
	BF16    bool
	OutW    cuda.DevPtr
	SumSq   cuda.DevPtr
}

// GroupSumSqBlocks is how many sums of squares a one-row grouped launch
// writes for its segment 0 sg at K (OutW / SumSq): that segment's blocks.
func (k *Set) GroupSumSqBlocks(sg GroupSeg, K int) int {
	return cdiv(sg.N, k.groupSumSqRows(sg, K))
}

// groupSumSqRows is the rows each of those blocks sums (the last one's past
// N count nothing): its groups' rows.
func (k *Set) groupSumSqRows(sg GroupSeg, K int) int {
	G, R := groupShape(k.c.Info().SMs, sg, K, 1)
	return R * (tileThreads / G)
}

// GroupNorm, when W is set, RMS-normalises every input row first, exactly as
// RMSNorm(x, W, eps) writes it.
type GroupNorm struct {
	W   cuda.DevPtr
	Eps float32
}

// groupShape is a segment's group size and the launch's rows per group. G
// is the tile GEMV's own choice for that matrix alone (tileLaunchShape,
// the single-row rules such as OneRowWholeChunks included): a
// thread's chunks, their order and the combine depend on G only, not on R,
// so each output equals the separate GemvFP8Tile / GemvBF16Tile launch bit
// for bit (bf16 from GemvBF16TileMinM rows: GemvBF16Tile takes no fewer).
// R is 8 rows per group (4 from 5 input rows, by registers) for every
// segment, the only variants compiled (2 and 4 at fewer rows were removed
// in session 54, never launched): the H200 sweep of docs/measured/h200-2026-12-01-attnin
// (run 1) timed the attention inputs of a layer at 9.8 us (q_a, kv_a, wk,
// weights_proj) and 21.7 us (q_b, wq_b with the norm) with 8 rows per group
// against 15.4 / 47.2 us with each matrix's own R (1-2: four times the
// blocks, each paying the norm prologue), and R=8 (4 at 8 input rows) was
// fastest or within 3% of it at every row count.
func groupShape(sms int, sg GroupSeg, K, M int) (G, R int) {
	esize := 1
	if sg.BF16 {
		esize = 2
	}
	G, _, _ = tileLaunchShape(sms, sg.N, K*esize, M, esize, 1, false, false, expertLaunch{})
	R = min(8, 32/tileMM(M))
	return G, R
}

// GroupNormRows is the most input rows a grouped launch with a norm should
// take: every block repeats the prologue per row, and at 8 rows one launch
// (183 us for q_b + wq_b) lost to RMSNorm then the two tile GEMVs (161 us),
// where two launches of 4 rows take 143 us (run 1).
const GroupNormRows = 4

// GroupOK says whether the grouped kernel takes x and the segments' weights:
// whole 16-byte chunks of K, float4-aligned x rows, 16-byte aligned weights.
func GroupOK(x cuda.DevPtr, K, ldx int, segs []GroupSeg) bool {
	if len(segs) == 0 || len(segs) > MaxGroupSegs {
		return false
	}
	for _, sg := range segs {
		esize := 1
		if sg.BF16 {
			esize = 2
		}
		if !TileOK(x, K, ldx, esize) || uint64(sg.W)%16 != 0 {
			return false
		}
	}
	return true
}

// GemvGroup runs every segment's GEMV of the same M <= MaxTileM input rows
// x [M][K] (row stride ldx), normalised first when norm.W is set, in one
// launch. Each segment's output is bit for bit what GemvFP8Tile /
// GemvBF16Tile (at 5..8 rows) writes for it alone (after RMSNorm, with
// norm), and reproducible run to run. The input must not alias any output.
func (k *Set) GemvGroup(s cuda.Stream, x cuda.DevPtr, K, M, ldx int, segs []GroupSeg, norm GroupNorm) error {
	_, err := k.gemvGroup(s, x, K, M, ldx, segs, norm, "")
	return err
}

// GroupMidShapes are the gemv_mid_group variants (cu/mid/gemv_mid.cu) by
// name: rows per group and loads a thread issues per round ("d16": 16, at
// most 128 registers, 2 blocks an SM; "o4": 8, at most 64, 4 blocks an SM).
var GroupMidShapes = map[string]int{"r8_d16": 8, "r4_d16": 4, "r4_o4": 4, "r2_o4": 2}

// GroupMidDefault is the variant TILERT_GPU_GEMV_MID=1|2 takes unless
// TILERT_GPU_GEMV_MID_SHAPE names another: every thread's share of its 8
// rows in flight at once (one round at K = 7168 with G = 256, as at K =
// 1536 with G = 64).
const GroupMidDefault = "r8_d16"

// groupMidKernel is the kernel of a GroupMidShapes name: "r8_d16" ->
// gemv_mid_group_r8_m1_d16.
func groupMidKernel(shape string) string {
	return "gemv_mid_group_" + strings.Replace(shape, "_", "_m1_", 1)
}

// GroupMidLaunches counts grouped launches that ran a gemv_mid_group
// kernel (tests).
var GroupMidLaunches atomic.Int64

// GroupQWLaunches counts grouped launches on gemv_group_r8_m1_qw (tests).
var GroupQWLaunches atomic.Int64

// GemvGroupMid is GemvGroup on the gemv_mid_group_<shape>_m1 kernel
// (cu/mid/gemv_mid.cu, the mid module; its _n twin with a norm, whose
// weights' first round is issued before the prologue) where it applies:
// one input row, shape one of GroupMidShapes. Each segment keeps its group
// size G (groupShape) and the norm is rmsnorm's, so the outputs are GemvGroup's bit for bit; elsewhere it is
// GemvGroup. It reports whether the mid kernel ran.
func (k *Set) GemvGroupMid(s cuda.Stream, x cuda.DevPtr, K, M, ldx int, segs []GroupSeg, norm GroupNorm, shape string) (bool, error) {
	if _, ok := GroupMidShapes[shape]; !ok || M != 1 {
		shape = ""
	}
	return k.gemvGroup(s, x, K, M, ldx, segs, norm, shape)
}

func (k *Set) gemvGroup(s cuda.Stream, x cuda.DevPtr, K, M, ldx int, segs []GroupSeg, norm GroupNorm, mid string) (bool, error) {
	if K <= 0 || M <= 0 || M > MaxTileM || ldx < K {
		return false, errors.Newf("gemv group: K=%d M=%d ldx=%d (M must be 1..%d, ldx >= K)", K, M, ldx, MaxTileM)
	}
	if !GroupOK(x, K, ldx, segs) {
		return false, errors.Newf("gemv group: %d segments, K=%d ldx=%d x=%#x: needs 1..%d segments, K*esize %% 16 == 0, ldx %% 4 == 0, aligned x and weights",
			len(segs), K, ldx, uint64(x), MaxGroupSegs)
	}
	sms := k.c.Info().SMs
	qw := len(segs) > 0 && (segs[0].OutW != 0 || segs[0].SumSq != 0)
	if qw && (segs[0].OutW == 0 || segs[0].SumSq == 0 || M != 1 || norm.W != 0 || mid != "") {
		return false, errors.Newf("gemv group: segment 0's OutW=%#x SumSq=%#x need each other, one input row (M=%d), no norm and the default kernels",
			uint64(segs[0].OutW), uint64(segs[0].SumSq), M)
	}
	for i := 1; i < len(segs); i++ {
		if segs[i].OutW != 0 || segs[i].SumSq != 0 {
			return false, errors.Newf("gemv group: segment %d has OutW / SumSq (segment 0 only)", i)
		}
	}
	args := make([]any, 0, 33)
	nthr := normThreads(K)
	// bit 17: the norm prologue issues its loads several at a time
	// (smallFast; the same sums).
	args = append(args, x, ldx, K, M, norm.W, norm.Eps, nthr|b2i(TileRule >= 2)<<16|b2i(smallFast)<<17)
	blocks, R := 0, 0
	for i := range MaxGroupSegs {
		if i >= len(segs) {
			args = append(args, cuda.DevPtr(0), cuda.DevPtr(0), cuda.DevPtr(0), 0, 0, 0)
			continue
		}
		sg := segs[i]
		if sg.N <= 0 || sg.Y == 0 || sg.W == 0 || (M > 1 && sg.LdY < sg.N) || (!sg.BF16 && sg.S == 0) {
			return false, errors.Newf("gemv group: segment %d: N=%d LdY=%d W=%#x S=%#x Y=%#x (fp8 needs scales; M > 1 needs LdY >= N)",
				i, sg.N, sg.LdY, uint64(sg.W), uint64(sg.S), uint64(sg.Y))
		}
		if x < sg.Y+cuda.DevPtr(4*((M-1)*sg.LdY+sg.N)) && sg.Y < x+cuda.DevPtr(4*((M-1)*ldx+K)) {
			return false, errors.Newf("gemv group: segment %d's output overlaps the input", i)
		}
		G, r := groupShape(sms, sg, K, M)
		if mid != "" {
			r = GroupMidShapes[mid] // G (the sums) stays
		}
		R = r // the same for every segment
		blocks += cdiv(cdiv(sg.N, R), tileThreads/G)
		args = append(args, sg.W, sg.S, sg.Y, sg.N, sg.LdY, G|b2i(sg.BF16)<<14)
	}
	name := fmt.Sprintf("gemv_group_r%d_m%d", R, tileMM(M))
	if qw {
		if R != 8 {
			return false, errors.Newf("gemv group: OutW / SumSq take 8 rows a group, not %d", R)
		}
		name += "_qw"
		args = append(args, segs[0].OutW, segs[0].SumSq)
	}
	if mid != "" {
		// With a norm, the _n twin: the prologue (the same sums as the
		// loop and fast ones) after the weights' first round.
		name = groupMidKernel(mid)
		if norm.W != 0 {
			name += "n"
		}
		mod, err := k.mid()
		if err != nil {
			return false, errors.Wrap(err, "gemv group: the mid module")
		}
		f, err := k.c.Function(mod, name)
		if err != nil {
			return false, err
		}
		if err := k.launchFn(f, cuda.D1(blocks), cuda.D1(tileThreads), 0, s, args...); err != nil {
			return false, err
		}
		GroupMidLaunches.Add(1)
		return true, nil
	}
	if err := k.launch(name, cuda.D1(blocks), cuda.D1(tileThreads), 0, s, args...); err != nil {
		return false, err
	}
	if qw {
		GroupQWLaunches.Add(1)
	}
	return false, nil
}
