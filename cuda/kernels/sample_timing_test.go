package kernels

import (
	"math/rand/v2"
	"testing"

	"github.com/tilert-go/tilert/cuda"
)

// samplerSettings are the sampling settings the timing tables time: real
// ones (DeepSeek-V3.2's generation_config: T 0.6, top-p 0.95) first.
var samplerSettings = []struct {
	name string
	p    SamplingParams
}{
	{"T=0.6 p=0.95", SamplingParams{Temperature: 0.6, TopP: 0.95, Seed: 1, Step: 9}},
	{"T=0.7 k=50 p=0.9", SamplingParams{Temperature: 0.7, TopK: 50, TopP: 0.9, Seed: 1, Step: 9}},
	{"T=1 (no filter)", SamplingParams{Temperature: 1, TopP: 1, Seed: 1, Step: 9}},
	{"T=1 min-p=0.05", SamplingParams{Temperature: 1, TopP: 1, MinP: 0.05, Seed: 1, Step: 9}},
}

// TestKernelTimingSample times the picks on one row of V = 129280 logits,
// direct launches and inside a CUDA graph (as a decode step replays them):
// the greedy argmax_wide, the one-block sample_rows and the many-block
// SampleWide at real settings, on flat logits (random weights: most tokens
// survive top-p) and on peaked ones (a trained model's: a few do).
func TestKernelTimingSample(t *testing.T) {
	needTiming(t)
	onGPU(t, func(c *cuda.Ctx, k *Set, a *allocs, r *rand.Rand) {
		s := c.Stream()
		add := timingTable(t, c, a, r, 256<<20, "sample: device-to-device copy 256 MiB (read+write)", "reference of this table")
		both := directAndGraph(c, s, add)
		const V = 129280
		flat := randF32(r, V, 2)
		peaked := randF32(r, V, 2)
		for i := range 40 {
			peaked[r.IntN(V)] = 14 + float32(i)*0.1
		}
		o := a.raw(4)
		asc := a.raw(ArgmaxScratchBytes(1))
		ssc := a.raw(SampleScratchBytes(1))
		chk(c.MemsetD8(asc, 0, ArgmaxScratchBytes(1), s))
		chk(c.MemsetD8(ssc, 0, SampleScratchBytes(1), s))
		settings := samplerSettings
		for _, rows := range []struct {
			name string
			x    []float32
		}{{"flat", flat}, {"peaked", peaked}} {
			x := a.up(rows.x)
			both("argmax_wide "+rows.name, 4*V, func() { chk(k.ArgmaxWide(s, o, 0, x, asc, 1, V, V)) })
			for _, sp := range settings {
				both("sample_wide "+rows.name+" "+sp.name, 4*V, func() { chk(k.SampleWide(s, o, x, ssc, 1, V, V, sp.p)) })
			}
			// The real settings again on fewer blocks, each a larger share
			// of the row (the default: 512 logits a block at least, 253 blocks).
			// Each block count's token is the default's (integer sums: the
			// cut does not depend on how the row is split).
			pick := func(sp SamplingParams) int32 {
				chk(k.SampleWide(s, o, x, ssc, 1, V, V, sp))
				return downI32(c, o, 1)[0]
			}
			for _, per := range []int{1024, 2048, 4096} {
				for _, sp := range settings[:2] {
					func() {
						want := pick(sp.p)
						defer func(old int) { sampleWidePer = old }(sampleWidePer)
						sampleWidePer = per
						nb := min(sampleWideBlocks, cdiv(V, per))
						if got := pick(sp.p); got != want {
							t.Errorf("sample_wide %s %s on %d blocks: token %d, %d on the default's", rows.name, sp.name, nb, got, want)
						}
						both(fmtName("sample_wide %s %s, %d blocks", rows.name, sp.name, nb), 4*V, func() { chk(k.SampleWide(s, o, x, ssc, 1, V, V, sp.p)) })
					}()
				}
			}
			for _, sp := range settings[:2] {
				add("sample_rows "+rows.name+" "+sp.name+" direct", 4*V, medianUs(c, s, 5, 11, func() { chk(k.Sample(s, o, x, 1, V, V, sp.p)) }), "")
			}
		}
	})
}
