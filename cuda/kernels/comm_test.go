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
