package kernels

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/tilert-go/tilert/cuda"
	"github.com/tilert-go/tilert/engine"
)

// The logit adjustments (penalties, logit_bias, min_tokens) and raw
// logprobs against the CPU engine's own functions (engine.ApplyAdjust,
// engine.Logprobs) on fresh random inputs: adjustments bit-identical,
// logprobs within float32 rounding, the same top alternatives.
func TestKernelLogits(t *testing.T) {
	onGPU(t, func(c *cuda.Ctx, k *Set, a *allocs, r *rand.Rand) {
		s := c.Stream()
		for _, V := range []int{129280, 37} {
			const rows = 4
			x := randF32(r, rows*V, 4)
			var words []int32
			want := append([]float32(nil), x...)
			for row := range rows {
				seen := map[int]bool{}
				var adj []engine.LogitAdjust
				for range min(V, 300) {
					tk := r.IntN(V)
					if seen[tk] {
						continue
					}
					seen[tk] = true
					la := engine.LogitAdjust{Tok: tk, Rep: 1}
					switch r.IntN(4) {
					case 0:
						la.Bias = float32(r.Float64()*200 - 100)
					case 1:
						la.Rep = float32(0.5 + r.Float64()*1.5)
						la.Sub = float32(r.Float64()*4 - 2)
					case 2:
						la.Block = true
					default:
						la.Bias, la.Rep, la.Sub = float32(r.NormFloat64()), float32(1.3), float32(r.Float64())
					}
					adj = append(adj, la)
					blk := int32(0)
					if la.Block {
						blk = 1
					}
					words = append(words, int32(row), int32(tk), int32(math.Float32bits(la.Bias)),
						int32(math.Float32bits(la.Rep)), int32(math.Float32bits(la.Sub)), blk)
				}
				engine.ApplyAdjust(want[row*V:(row+1)*V], adj)
			}
			xp := a.up(x)
			chk(k.AdjustLogits(s, xp, a.up(words), len(words)/AdjustWords, V))
			got := downF32(c, xp, rows*V)
			mism := 0
			for i := range got {
				if math.Float32bits(got[i]) != math.Float32bits(want[i]) {
					mism++
				}
			}
			record(t, fmt.Sprintf("adjust_logits V=%d (%d entries) == engine.ApplyAdjust", V, len(words)/AdjustWords), "differing logits", float64(mism), 0)
		}
		for _, V := range []int{129280, 37} {
			const rows, K = 5, 20
			x := randF32(r, rows*V, 3)
			for i := range x { // ties
				if r.IntN(7) == 0 {
					x[i] = float32(math.Round(float64(x[i])))
				}
			}
			x[V+3] = float32(math.NaN())
			toks := make([]int32, rows)
			for i := range toks {
				toks[i] = int32(r.IntN(V))
				if toks[i] == int32(V+3-V) && i == 1 {
					toks[i]++
				}
			}
			kk := min(K, V)
			lp, tid, tlp := a.poisoned(rows), a.poisoned(rows*kk), a.poisoned(rows*kk)
			chk(k.Logprobs(s, a.up(x), a.up(toks), lp, tid, tlp, rows, V, V, kk))
			glp, gid, gtl := downF32(c, lp, rows), downI32(c, tid, rows*kk), downF32(c, tlp, rows*kk)
			var maxErr float64
			idMism := 0
			for row := range rows {
				ref := engine.Logprobs(x[row*V:(row+1)*V], int(toks[row]), kk)
				maxErr = math.Max(maxErr, math.Abs(float64(glp[row]-ref.Logprob)))
				for j, alt := range ref.Top {
					if int(gid[row*kk+j]) != alt.ID {
						idMism++
					}
					maxErr = math.Max(maxErr, math.Abs(float64(gtl[row*kk+j]-alt.Logprob)))
				}
			}
			// Row 1 holds a NaN: it is skipped by both the sum and the top-k.
			for j := 0; j < kk; j++ {
				if gid[kk+j] == int32(3) {
					idMism++
				}
			}
			record(t, fmt.Sprintf("logprob_rows V=%d k=%d (ties) vs engine.Logprobs", V, kk), "max |d logprob|", maxErr, 2e-5)
			record(t, fmt.Sprintf("logprob_rows V=%d k=%d top ids", V, kk), "mismatched ids", float64(idMism), 0)
		}
	})
}
