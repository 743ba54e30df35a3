package kernels

import (
	"math/rand/v2"
	"testing"

	"github.com/tilert-go/tilert/cuda"
)

// groupGraphUs captures n calls of f (call i gets i) into one CUDA graph on a
// fresh stream and returns the median time of one call over reps replays:
// launch gaps as a decode step's graph has them.
func groupGraphUs(c *cuda.Ctx, n, reps int, f func(s cuda.Stream, i int)) float64 {
	s, err := c.NewStream()
	chk(err)
	defer c.DestroyStream(s)
	return graphUsRot(c, s, n, reps, func(i int) { f(s, i) })
}

// TestKernelGroupTiming times the grouped attention-input GEMVs of a
// DeepSeek-V3.2 layer against the launches they replace, weights cold,
// each as direct launches and inside a CUDA graph (as the engine replays
// a step). Reported, never asserted. (Its sweep of 2 and 4 rows per group
// went with those kernels in session 54: R=8, 4 at 8 rows, is the one
// compiled.)
//
//   - in: q_a 1536x7168, kv_a 576x7168, indexer wk 128x7168 (fp8) and
//     weights_proj 64x7168 (bf16) of the layer input; before: three tile
//     GEMVs and the bf16 wide one (the engine's choice up to 4 rows).
//   - qb: q_b 24576x1536 and indexer wq_b 8192x1536 (fp8) of the normed q_a;
//     before: RMSNorm then two tile GEMVs.
func TestKernelGroupTiming(t *testing.T) {
	needTiming(t)
	onGPU(t, func(c *cuda.Ctx, k *Set, a *allocs, r *rand.Rand) {
		s := c.Stream()
		add := timingTable(t, c, a, r, 1<<30, "group: device-to-device copy 1 GiB (read+write)", "reference")
		type seg struct {
			N, K int
			bf16 bool
		}
		run := func(what string, K int, norm bool, segs []seg) {
			var bytes int64
			for _, sg := range segs {
				eb := int64(1)
				if sg.bf16 {
					eb = 2
				}
				bytes += eb * int64(sg.N*K)
			}
			nc := coldCopies(bytes)
			ws := make([][]cuda.DevPtr, len(segs))
			ss := make([][]cuda.DevPtr, len(segs))
			ys := make([]cuda.DevPtr, len(segs))
			for i, sg := range segs {
				if sg.bf16 {
					ws[i] = devBF16s(c, a, r, nc, sg.N, K)
					ss[i] = make([]cuda.DevPtr, nc)
				} else {
					ws[i], ss[i] = devFP8s(c, a, r, nc, sg.N, K)
				}
				ys[i] = a.raw(int64(4 * MaxTileM * sg.N))
			}
			x := a.up(randF32(r, MaxTileM*K, 1))
			xn := a.raw(int64(4 * MaxTileM * K))
			nw := a.up(randF32(r, K, 1))
			gnorm := GroupNorm{}
			if norm {
				gnorm = GroupNorm{W: nw, Eps: 1e-6}
			}
			before := func(s cuda.Stream, i, M int) {
				xx := x
				if norm {
					chk(k.RMSNorm(s, xn, x, nw, M, K, K, K, 1e-6))
					xx = xn
				}
				for j, sg := range segs {
					w, sc := ws[j][i%nc], ss[j][i%nc]
					switch {
					case sg.bf16 && M <= 4:
						chk(k.GemvBF16Wide(s, ys[j], xx, w, 0, sg.N, K, M, K, sg.N))
					case sg.bf16:
						chk(k.GemvBF16Tile(s, ys[j], xx, w, 0, sg.N, K, M, K, sg.N))
					default:
						chk(k.GemvFP8Tile(s, ys[j], xx, w, sc, 0, sg.N, K, M, K, sg.N))
					}
				}
			}
			group := func(s cuda.Stream, i, M int) {
				gs := make([]GroupSeg, len(segs))
				for j, sg := range segs {
					gs[j] = GroupSeg{W: ws[j][i%nc], S: ss[j][i%nc], Y: ys[j], N: sg.N, LdY: sg.N, BF16: sg.bf16}
				}
				chk(k.GemvGroup(s, x, K, M, K, gs, gnorm))
			}
			for _, M := range []int{1, 2, 4, 8} {
				b := float64(bytes) + float64(4*M*K)
				i := 0
				old := medianUs(c, s, 2*nc, 11, func() { before(s, i, M); i++ })
				oldG := groupGraphUs(c, 2*nc, 11, func(s cuda.Stream, i int) { before(s, i, M) })
				add(fmtName("%s before M=%d cold, direct", what, M), b, old, fmtName("%d launches", len(segs)+b2i(norm)))
				add(fmtName("%s before M=%d cold, graph", what, M), b, oldG, "")
				us := medianUs(c, s, 2*nc, 11, func() { group(s, i, M); i++ })
				usG := groupGraphUs(c, 2*nc, 11, func(s cuda.Stream, i int) { group(s, i, M) })
				add(fmtName("%s gemv_group M=%d cold, direct", what, M), b, us, fmtName("%.2fx before", old/us))
				add(fmtName("%s gemv_group M=%d cold, graph", what, M), b, usG, fmtName("%.2fx before (graph)", oldG/usG))
			}
		}
		run("attn in (q_a, kv_a, wk, wproj)", 7168, false, []seg{{1536, 7168, false}, {576, 7168, false}, {128, 7168, false}, {64, 7168, true}})
		run("q_b + idx wq_b after rmsnorm", 1536, true, []seg{{24576, 1536, false}, {8192, 1536, false}})
	})
}
