package kernels

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/cockroachdb/errors"

	"github.com/tilert-go/tilert/cuda"
)

// The sharded engine's collectives on one GPU: the one-shot all-reduce
// kernel against its CPU reference (a float32 sum in rank order, bit for
// bit, every rank's buffer), and NCCL with one rank (what one H200 allows:
// NCCL refuses two ranks on one device). Latencies are reported as timing
// rows: on one device they are the kernels' own cost, without a link.

func TestKernelAllReduceOneShot(t *testing.T) {
	onGPU(t, func(c *cuda.Ctx, k *Set, a *allocs, r *rand.Rand) {
		s := c.Stream()
		for _, nr := range []int{1, 2, 4, 8} {
			for _, n := range []int{7168, 4 * 7168, 6144, 129280} {
				in := make([][]float32, nr)
				ptrs := make([]cuda.DevPtr, nr)
				for i := range in {
					in[i] = randF32(r, n, 4)
					ptrs[i] = a.up(in[i])
				}
				table := a.up(ptrs)
				chk(k.AllReduceOneShot(s, table, nr, n))
				want := make([]float32, n)
				for j := range want {
					acc := in[0][j]
					for i := 1; i < nr; i++ {
						acc += in[i][j]
					}
					want[j] = acc
				}
				diff := 0
				for i := range ptrs {
					got := downF32(c, ptrs[i], n)
					for j := range got {
						if math.Float32bits(got[j]) != math.Float32bits(want[j]) {
							diff++
						}
					}
				}
				record(t, fmt.Sprintf("allreduce_oneshot ranks=%d n=%d (every rank)", nr, n), "elements != rank-order float32 sum", float64(diff), 0)
			}
		}
		if testing.Short() {
			return
		}
		for _, nr := range []int{2, 8} {
			const n = 7168 // one hidden vector of DeepSeek-V3.2 / GLM-5 (28 KB float32)
			ptrs := make([]cuda.DevPtr, nr)
			for i := range ptrs {
				ptrs[i] = a.up(randF32(r, n, 1))
			}
			table := a.up(ptrs)
			us := medianUs(c, s, 50, 21, func() { chk(k.AllReduceOneShot(s, table, nr, n)) })
			addTiming(t, fmt.Sprintf("allreduce_oneshot %d ranks on one device, n=%d", nr, n), float64(4*n*(2*nr)), us, "one launch; no link crossed")
		}
	})
}

// The fused all-reduce + residual add + RMSNorm (ranks on one device: one
// launch writes every rank's x and h) against its CPU reference: x is the
// float32 residual plus the rank-order sum, bit for bit on every rank; h is
// the RMSNorm of it within float32 bounds, the same bits on every rank.
// Twice in a row on the same scratch: the row counters must come back to
// zero.
func TestKernelAllReduceAddRMSNorm(t *testing.T) {
	onGPU(t, func(c *cuda.Ctx, k *Set, a *allocs, r *rand.Rand) {
		s := c.Stream()
		for _, nr := range []int{1, 2, 4, 8} {
			for _, sh := range []struct{ rows, D int }{{1, 7168}, {4, 7168}, {1, 6144}, {3, 1000}} {
				rows, D := sh.rows, sh.D
				n := rows * D
				x := randF32(r, n, 2)
				w := randF32(r, D, 1)
				parts := make([][]float32, nr)
				pp := make([]cuda.DevPtr, nr)
				outs := make([]cuda.DevPtr, 0, 3*nr)
				xs, hs := make([]cuda.DevPtr, nr), make([]cuda.DevPtr, nr)
				for i := range parts {
					parts[i] = randF32(r, n, 1)
					pp[i] = a.up(parts[i])
					xs[i], hs[i] = a.up(x), a.poisoned(n)
					outs = append(outs, xs[i], hs[i], a.up(w))
				}
				scratch := a.raw(ArScratchBytes(rows, D))
				chk(c.MemsetD8(scratch, 0, ArScratchBytes(rows, D), s))
				pt, ot := a.up(pp), a.up(outs)
				chk(k.AllReduceAddRMSNorm(s, pt, nr, ot, nr, rows, D, 1e-6, scratch, PeerBarrier{}))
				want := make([]float32, n)
				for j := range want {
					acc := parts[0][j]
					for i := 1; i < nr; i++ {
						acc += parts[i][j]
					}
					want[j] = x[j] + acc
				}
				// Again: x += the same sum once more.
				chk(k.AllReduceAddRMSNorm(s, pt, nr, ot, nr, rows, D, 1e-6, scratch, PeerBarrier{}))
				for j := range want {
					acc := parts[0][j]
					for i := 1; i < nr; i++ {
						acc += parts[i][j]
					}
					want[j] += acc
				}
				name := fmt.Sprintf("allreduce_add_rmsnorm ranks=%d rows=%d D=%d", nr, rows, D)
				h0 := downF32(c, hs[0], n)
				xdiff, hdiff, worst := 0, 0, 0.0
				for i := range xs {
					gx, gh := downF32(c, xs[i], n), downF32(c, hs[i], n)
					for j := range gx {
						if math.Float32bits(gx[j]) != math.Float32bits(want[j]) {
							xdiff++
						}
						if math.Float32bits(gh[j]) != math.Float32bits(h0[j]) {
							hdiff++
						}
					}
					worst = max(worst, relErr(gh, refRMSNorm(want, w, rows, D, 1e-6)))
				}
				record(t, name+" residual (every rank)", "elements != float32 x + rank-order sum", float64(xdiff), 0)
				record(t, name+" norm (every rank)", relMetric, worst, boundF32)
				record(t, name+" norm, same bits on every rank", "elements != rank 0's", float64(hdiff), 0)
			}
		}
		if testing.Short() {
			return
		}
		// Latency at batch 1 of one hidden vector (DeepSeek-V3.2, 28 KB):
		// the fused launch for 8 ranks on one device (what a sharded step
		// on one H200 runs twice per layer), a rank's own launch (nout 1:
		// what one GPU of a node runs, less the link), and the pair it
		// replaces (one all-reduce + 8 add_rmsnorm).
		const D = 7168
		for _, nr := range []int{2, 8} {
			pp := make([]cuda.DevPtr, nr)
			var outs []cuda.DevPtr
			var xs, hs, ws []cuda.DevPtr
			for i := range pp {
				pp[i] = a.up(randF32(r, D, 1e-3))
				xs = append(xs, a.up(randF32(r, D, 1)))
				hs = append(hs, a.poisoned(D))
				ws = append(ws, a.up(randF32(r, D, 1)))
				outs = append(outs, xs[i], hs[i], ws[i])
			}
			pt, ot := a.up(pp), a.up(outs)
			scratch := a.raw(ArScratchBytes(1, D))
			chk(c.MemsetD8(scratch, 0, ArScratchBytes(1, D), s))
			us := medianUs(c, s, 50, 21, func() { chk(k.AllReduceAddRMSNorm(s, pt, nr, ot, nr, 1, D, 1e-6, scratch, PeerBarrier{})) })
			addTiming(t, fmt.Sprintf("allreduce_add_rmsnorm %d ranks one device, all outs", nr), float64(4*D*(3*nr+1)), us, "fused; one launch for every rank")
			us = medianUs(c, s, 50, 21, func() { chk(k.AllReduceAddRMSNorm(s, pt, nr, ot, 1, 1, D, 1e-6, scratch, PeerBarrier{})) })
			addTiming(t, fmt.Sprintf("allreduce_add_rmsnorm %d ranks, one rank's out", nr), float64(4*D*(nr+3)), us, "fused; a node GPU's launch without the link")
			us = medianUs(c, s, 50, 21, func() {
				chk(k.AllReduceOneShot(s, pt, nr, D))
				for i := range xs {
					chk(k.AddRMSNorm(s, hs[i], xs[i], pp[0], ws[i], 1, D, D, D, D, 1e-6))
				}
			})
			addTiming(t, fmt.Sprintf("allreduce_oneshot + %d add_rmsnorm (unfused)", nr), float64(4*D*(2*nr+4*nr)), us, "the pair the fused kernel replaces")
		}
	})
}

// The cross-GPU protocol on one device: each rank on its own stream (the
// streams run concurrently, as GPUs would), its partial buffers and its
// barrier flags in memory the others address. For iters iterations every
// rank writes fresh partials into buffer A or B (alternating, as the engine
// alternates its attention and MLP buffers), then runs the fused kernel
// with the barrier; every fourth iteration also an out-of-place all-reduce
// and a broadcast from rank 0. Without the barrier a rank would read a
// peer's buffer before it is written or after it is overwritten; the result
// must be the CPU's, bit for bit on the residual, on every rank.
func TestKernelPeerBarrierStreams(t *testing.T) {
	onGPU(t, func(c *cuda.Ctx, k *Set, a *allocs, r *rand.Rand) {
		chk(k.Preload())
		names, err := KernelNames(k.Build)
		chk(err)
		record(t, "kernels preloaded (module entry points found)", "entry points < 40", float64(max(0, 40-len(names))), 0)
		const D, rows, iters = 7168, 2, 48
		n := rows * D
		for _, nr := range []int{2, 4, 8} {
			streams := make([]cuda.Stream, nr)
			for i := range streams {
				st, err := c.NewStream()
				chk(err)
				streams[i] = st
				defer func() { chk(c.DestroyStream(st)) }()
			}
			// fresh[it][rank]: the partial rank writes at iteration it.
			fresh := make([][][]float32, iters)
			freshP := make([][]cuda.DevPtr, iters)
			for it := range fresh {
				fresh[it] = make([][]float32, nr)
				freshP[it] = make([]cuda.DevPtr, nr)
				for i := range nr {
					fresh[it][i] = randF32(r, n, 0.1)
					freshP[it][i] = a.up(fresh[it][i])
				}
			}
			x0 := randF32(r, n, 1)
			w := randF32(r, D, 1)
			bufA, bufB := make([]cuda.DevPtr, nr), make([]cuda.DevPtr, nr)
			flags, xs, hs, sums, ids := make([]cuda.DevPtr, nr), make([]cuda.DevPtr, nr), make([]cuda.DevPtr, nr), make([]cuda.DevPtr, nr), make([]cuda.DevPtr, nr)
			outT, scr := make([]cuda.DevPtr, nr), make([]cuda.DevPtr, nr)
			for i := range nr {
				scr[i] = a.raw(ArScratchBytes(rows, D))
				chk(c.MemsetD8(scr[i], 0, ArScratchBytes(rows, D), c.Stream()))
				bufA[i], bufB[i] = a.poisoned(n), a.poisoned(n)
				flags[i] = a.raw(PeerFlagBytes(nr))
				chk(c.MemsetD32(flags[i], 0, PeerFlagBytes(nr)/4, c.Stream()))
				xs[i], hs[i], sums[i], ids[i] = a.up(x0), a.poisoned(n), a.poisoned(n), a.poisoned(n)
				outT[i] = a.up([]cuda.DevPtr{xs[i], hs[i], a.up(w)})
			}
			chk(c.Synchronize())
			flagT, tA, tB := a.up(flags), a.up(bufA), a.up(bufB)
			// Load every kernel of the loop before it: a first launch that
			// loads its function (lazy module loading) waits for the device,
			// where a rank's kernel spins until a later launch of this host
			// thread signals it.
			chk(k.AllReduceTo(c.Stream(), tA, nr, sums[0], n, PeerBarrier{}))
			chk(k.BroadcastFrom(c.Stream(), bufA[0], ids[0], int64(4*n), PeerBarrier{}))
			warmScr := a.raw(ArScratchBytes(rows, D))
			chk(c.MemsetD8(warmScr, 0, ArScratchBytes(rows, D), c.Stream()))
			chk(k.AllReduceAddRMSNorm(c.Stream(), tA, nr, a.up([]cuda.DevPtr{a.poisoned(n), a.poisoned(n), a.up(w)}), 1, rows, D, 1e-6, warmScr, PeerBarrier{}))
			chk(c.Synchronize())
			bar := func(i int) PeerBarrier { return PeerBarrier{Flags: flags[i], Table: flagT, Rank: i, Ranks: nr} }
			want := append([]float32(nil), x0...)
			var lastSum, last []float32 // of the last iteration with a broadcast
			for it := range iters {
				buf, tab := bufA, tA
				if it%2 == 1 {
					buf, tab = bufB, tB
				}
				for i := range nr {
					chk(c.CopyDtoD(buf[i], freshP[it][i], int64(4*n), streams[i]))
					chk(k.AllReduceAddRMSNorm(streams[i], tab, nr, outT[i], 1, rows, D, 1e-6, scr[i], bar(i)))
					if it%4 == 3 {
						chk(k.AllReduceTo(streams[i], tab, nr, sums[i], n, bar(i)))
						chk(k.BroadcastFrom(streams[i], buf[0], ids[i], int64(4*n), bar(i)))
					}
				}
				sum := make([]float32, n)
				for j := range sum {
					acc := fresh[it][0][j]
					for i := 1; i < nr; i++ {
						acc += fresh[it][i][j]
					}
					sum[j] = acc
					want[j] += acc
				}
				if it%4 == 3 {
					lastSum, last = sum, fresh[it][0]
				}
			}
			chk(c.Synchronize())
			name := fmt.Sprintf("peer barrier %d ranks on %d streams, %d iterations", nr, nr, iters)
			xdiff, sdiff, bdiff, worst := 0, 0, 0, 0.0
			for i := range nr {
				for j, v := range downF32(c, xs[i], n) {
					if math.Float32bits(v) != math.Float32bits(want[j]) {
						xdiff++
					}
				}
				for j, v := range downF32(c, sums[i], n) {
					if math.Float32bits(v) != math.Float32bits(lastSum[j]) {
						sdiff++
					}
				}
				for j, v := range downF32(c, ids[i], n) {
					if math.Float32bits(v) != math.Float32bits(last[j]) {
						bdiff++
					}
				}
				worst = max(worst, relErr(downF32(c, hs[i], n), refRMSNorm(want, w, rows, D, 1e-6)))
			}
			record(t, name+": fused residual (every rank)", "elements != float32 x + rank-order sums", float64(xdiff), 0)
			record(t, name+": fused norm (every rank)", relMetric, worst, boundF32)
			record(t, name+": allreduce_to (every rank)", "elements != rank-order sum", float64(sdiff), 0)
			record(t, name+": broadcast_from rank 0", "elements != rank 0's buffer", float64(bdiff), 0)
			if nr == 8 && !testing.Short() {
				// One barrier round on 8 concurrent streams of one device:
				// the flag protocol's own cost (no link crossed).
				e0, err := c.NewEvent()
				chk(err)
				e1, err := c.NewEvent()
				chk(err)
				const reps = 200
				chk(c.Synchronize())
				chk(c.Record(e0, streams[0]))
				for range reps {
					for i := range nr {
						chk(k.AllReduceAddRMSNorm(streams[i], tA, nr, outT[i], 1, 1, D, 1e-6, scr[i], bar(i)))
					}
				}
				chk(c.Record(e1, streams[0]))
				chk(c.EventSync(e1))
				ms, err := c.Elapsed(e0, e1)
				chk(err)
				chk(c.Synchronize())
				chk(c.DestroyEvent(e0))
				chk(c.DestroyEvent(e1))
				addTiming(t, "allreduce_add_rmsnorm + peer barrier, 8 streams", float64(4*D*(nr+3)), float64(ms)*1000/reps, "per round, 8 ranks' launches concurrent on one device")
			}
		}
	})
}

// addTiming reports a kernel latency row (as TestKernelTiming does).
func addTiming(t *testing.T, name string, bytes, us float64, comment string) {
	row := timingRow{Name: name, Bytes: bytes, Median: us, GBps: bytes / us / 1e3, Comment: comment}
	reportMu.Lock()
	timingRows = append(timingRows, row)
	reportMu.Unlock()
	t.Logf("%-44s %10.3g B %9.2f us", name, bytes, us)
}

func TestNCCLSingleRank(t *testing.T) {
	d := gpuDevice(t)
	lib, err := cuda.LoadNCCL()
	if err != nil {
		if errors.Is(err, cuda.ErrNoNCCL) {
			t.Skipf("no NCCL here: %v", err)
		}
		t.Fatalf("%+v", err)
	}
	t.Logf("NCCL %s from %s", lib.VersionString(), lib.Path)
	onGPU(t, func(c *cuda.Ctx, k *Set, a *allocs, r *rand.Rand) {
		s := c.Stream()
		comms, err := lib.CommInitAll([]int{d.Info.Ordinal})
		chk(err)
		defer func() { chk(lib.CommDestroy(comms[0])) }()
		const n = 7168
		x := randF32(r, n, 1)
		p := a.up(x)
		out := a.poisoned(n)
		chk(lib.AllReduceSumF32(p, out, n, comms[0], s))
		chk(c.SyncStream(s))
		diff := 0
		for j, v := range downF32(c, out, n) {
			if math.Float32bits(v) != math.Float32bits(x[j]) {
				diff++
			}
		}
		record(t, "nccl all-reduce, 1 rank, n=7168", "elements != input", float64(diff), 0)
		b := a.poisoned(n)
		chk(lib.Broadcast(p, b, 4*n, 0, comms[0], s))
		chk(c.SyncStream(s))
		diff = 0
		for j, v := range downF32(c, b, n) {
			if math.Float32bits(v) != math.Float32bits(x[j]) {
				diff++
			}
		}
		record(t, "nccl broadcast, 1 rank, n=7168", "elements != input", float64(diff), 0)
		us := medianUs(c, s, 50, 21, func() { chk(lib.AllReduceSumF32(p, p, n, comms[0], s)) })
		addTiming(t, "nccl all-reduce 1 rank, n=7168 (in place)", 4*2*n, us, "NCCL "+lib.VersionString()+"; launch cost, no link")
	})
}
