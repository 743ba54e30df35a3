package kernels

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/tilert-go/tilert/cuda"
)

// withSampleWideOne sets SampleWideOne for the rest of the test.
func withSampleWideOne(t *testing.T, on bool) {
	old := SampleWideOne
	SampleWideOne = on
	t.Cleanup(func() { SampleWideOne = old })
}

// TestSampleWideOneBlocks: sample_wide_one takes SampleWide's blocks a row
// while every row's blocks fit the device at once, fewer beyond, none when
// not even a block a row fits.
func TestSampleWideOneBlocks(t *testing.T) {
	for _, c := range []struct{ n, rows, sms, perSM, want int }{
		{129280, 1, 132, 8, 253}, {129280, 4, 132, 8, 253}, {129280, 5, 132, 8, 211}, {129280, 16, 132, 8, 66},
		{4097, 1, 132, 8, 9}, {5, 3, 132, 8, 1}, {129280, 1, 100, 2, 200}, {129280, 300, 132, 2, 0},
	} {
		if got := sampleWideOneBlocks(c.n, c.rows, c.sms, c.perSM); got != c.want {
			t.Errorf("sampleWideOneBlocks(n=%d, rows=%d, sms=%d, perSM=%d) = %d, want %d", c.n, c.rows, c.sms, c.perSM, got, c.want)
		}
	}
}

// TestKernelSampleWideOne: sample_wide_one (SampleWideOne: the sampled pick
// as one cooperative launch with grid barriers) gives SampleWide's token on
// every row (the same survivors, cut and draw), at the real settings and
// the odd ones of TestKernelSampling, on rows of 129280, 4097 and 5 logits
// (an all -inf row among them), one to four rows a launch; launched twice
// on one scratch and then replayed in a graph with the same result; and it
// leaves the scratch as it found it but for the barrier's generation word
// (the arrival counts and all three histogram regions zero). Fails unless
// the launch counter saw it run.
func TestKernelSampleWideOne(t *testing.T) {
	onGPU(t, func(c *cuda.Ctx, k *Set, a *allocs, r *rand.Rand) {
		s := c.Stream()
		const maxRows = 4
		sc := a.raw(SampleScratchBytes(maxRows))
		chk(c.MemsetD8(sc, 0, SampleScratchBytes(maxRows), s))
		n0 := SampleWideOneLaunches.Load()
		for _, cs := range []SamplingParams{{Temperature: 0.6, TopP: 0.95}, {Temperature: 0.7, TopK: 50, TopP: 0.9}, {Temperature: 1, TopP: 1},
			{Temperature: 1, TopP: 1, MinP: 0.05}, {Temperature: 0.8, TopK: 1, TopP: 1}, {Temperature: 1.3, TopK: 4000, TopP: 0.5, MinP: 0.001}} {
			for _, n := range []int{129280, 4097, 5} {
				for _, rows := range []int{1, maxRows} {
					cs.Seed, cs.Step = r.Uint64(), r.Uint64N(1<<40)
					x := randF32(r, rows*n, 2+4*r.Float64())
					if rows > 1 {
						for i := range n {
							x[(rows-1)*n+i] = float32(math.Inf(-1))
						}
					}
					xp := a.up(x)
					pick := func(one bool) []int32 {
						op := a.poisoned(rows)
						withSampleWideOne(t, one)
						chk(k.SampleWide(s, op, xp, sc, rows, n, n, cs))
						return downI32(c, op, rows)
					}
					want := pick(false)
					got := pick(true)
					again := pick(true)
					// The same launch captured and replayed.
					op := a.poisoned(rows)
					withSampleWideOne(t, true)
					chk(c.BeginCapture(s))
					chk(k.SampleWide(s, op, xp, sc, rows, n, n, cs))
					g, err := c.EndCapture(s)
					chk(err)
					chk(c.LaunchGraph(g, s))
					chk(c.LaunchGraph(g, s))
					chk(c.SyncStream(s))
					chk(c.DestroyGraph(g))
					replayed := downI32(c, op, rows)
					mism := 0
					for row := range rows {
						if got[row] != want[row] || again[row] != want[row] || replayed[row] != want[row] {
							mism++
							t.Logf("n=%d rows=%d row %d %+v: sample wide %d, one launch %d, again %d, replayed %d", n, rows, row, cs, want[row], got[row], again[row], replayed[row])
						}
					}
					record(t, fmt.Sprintf("sample_wide_one == sample wide T=%.1f k=%d p=%.2f min-p=%.3f n=%d rows=%d", cs.Temperature, cs.TopK, cs.TopP, cs.MinP, n, rows), "mismatched rows", float64(mism), 0)
				}
			}
		}
		withSampleWideOne(t, false)
		if SampleWideOneLaunches.Load() == n0 {
			t.Fatal("SampleWideOne: no launch of sample_wide_one")
		}
		// The scratch as found: every byte zero but each row's gen word.
		b := downBytes(c, sc, int(SampleScratchBytes(maxRows)))
		left := 0
		for i, v := range b {
			if off := i % sampleWideRowBytes; v != 0 && (off < 4 || off >= 8) {
				left++
			}
		}
		record(t, "sample_wide_one scratch left zeroed (the barrier's gen aside)", "non-zero bytes", float64(left), 0)
	})
}
