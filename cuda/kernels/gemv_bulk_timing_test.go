package kernels

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/tilert-go/tilert/cuda"
)

// TestKernelBulkTiming times the bulk-copy GEMV (gemv_bulk_fp8) beside the
// tile GEMV on the issue-10 decode shapes (o_proj 7168x16384, q_b
// 24576x1536, the 9 gate-up slots 2x2048x7168 paired and the 9 down slots
// 7168x2048 of DeepSeek-V3.2's MoE, 64 experts: past L2), weights cold,
// graph-timed (groupGraphUs), next to a 1 GiB device-to-device copy; logs
// a sweep of group sizes and blocks per SM. Reported, never asserted.
func TestKernelBulkTiming(t *testing.T) {
	needTiming(t)
	needBulkCheck(t)
	defer func() { forceBulkG, forceBulkB = 0, 0 }()
	onGPU(t, func(c *cuda.Ctx, k *Set, a *allocs, r *rand.Rand) {
		if err := k.WGSupported(); err != nil {
			t.Skipf("no sm_90a module here: %v", err)
		}
		add := timingTable(t, c, a, r, 1<<30, "bulk: device-to-device copy 1 GiB (read+write)", "reference")
		sweep := func(what string, f func(s cuda.Stream, i int), n int) {
			line := ""
			for _, g := range []int{32, 64, 128, 256} {
				for _, b := range []int{2, 1} {
					forceBulkG, forceBulkB = g, b
					line += fmt.Sprintf(" G%d/B%d:%.1f", g, b, groupGraphUs(c, n, 5, f))
				}
			}
			forceBulkG, forceBulkB = 0, 0
			t.Logf("bulk sweep %s us:%s", what, line)
		}
		dense := func(N, K int, what string) {
			nc := coldCopies(int64(N * K))
			ws, ss := devFP8s(c, a, r, nc, N, K)
			x := a.up(randF32(r, K, 1))
			y := a.raw(int64(4 * N))
			bytes := float64(N*K + 4*cdiv(N, 128)*cdiv(K, 128) + 4*(K+N))
			tile := groupGraphUs(c, 2*nc, 11, func(s cuda.Stream, i int) {
				chk(k.GemvFP8Tile(s, y, x, ws[i%nc], ss[i%nc], 0, N, K, 1, K, N))
			})
			G, R := tileShape(k.c.Info().SMs, N, K, 1, 1, false)
			add(fmtName("gemv_tile_fp8 N=%d K=%d M=1 cold, graph G=%d R=%d%s", N, K, G, R, tileVariant(G, R, K, 1, 1)), bytes, tile, what)
			bf := func(s cuda.Stream, i int) { chk(k.GemvFP8Bulk(s, y, x, ws[i%nc], ss[i%nc], 0, N, K)) }
			for _, b := range []int{2, 1} {
				forceBulkB = b
				us := groupGraphUs(c, 2*nc, 11, bf)
				add(fmtName("gemv_bulk_fp8 N=%d K=%d cold, graph G=%d B=%d", N, K, G, b), bytes, us, fmtName("%.2fx tile", tile/us))
			}
			forceBulkB = 0
			sweep(fmtName("N=%d K=%d", N, K), bf, 2*nc)
		}
		dense(7168, 16384, "o_proj")
		dense(24576, 1536, "q_b")
		// The MoE projections of one row: 8 routed slots of 64 experts and
		// the shared expert.
		const E, top, H, I, sets = 64, 8, 7168, 2048, 16
		mk := func(n, kk int) (tw, ts, sw, ss cuda.DevPtr) {
			wt, st := devFP8s(c, a, r, E+1, n, kk)
			return a.up(wt[:E]), a.up(st[:E]), wt[E], st[E]
		}
		gT, gS, gW, gSW := mk(I, H)
		uT, uS, uW, uSW := mk(I, H)
		dT, dS, dW, dSW := mk(H, I)
		idps := make([]cuda.DevPtr, sets)
		for i := range idps {
			ids := make([]int32, top)
			for j, e := range r.Perm(E)[:top] {
				ids[j] = int32(e)
			}
			idps[i] = a.up(ids)
		}
		h := a.up(randF32(r, H, 1))
		eg := a.raw(int64(4 * (top + 1) * I))
		ey := a.raw(int64(4 * (top + 1) * H))
		slots := top + 1
		type launch func(s cuda.Stream, i int)
		for _, p := range []struct {
			what       string
			bytes      float64
			tile, bulk launch
			N, K       int
			pair       bool
		}{
			{"experts gate-up 8+1 slots (2x2048x7168 paired)", float64(slots * 2 * I * H),
				func(s cuda.Stream, i int) {
					chk(k.ExpertsFP8(s, eg, h, H, top, 0, [2]cuda.DevPtr{gT, uT}, [2]cuda.DevPtr{gS, uS}, idps[i%sets], top,
						[2]cuda.DevPtr{gW, uW}, [2]cuda.DevPtr{gSW, uSW}, 1, I, H))
				},
				func(s cuda.Stream, i int) {
					chk(k.ExpertsFP8Bulk(s, eg, h, H, top, 0, [2]cuda.DevPtr{gT, uT}, [2]cuda.DevPtr{gS, uS}, idps[i%sets], top,
						[2]cuda.DevPtr{gW, uW}, [2]cuda.DevPtr{gSW, uSW}, 1, I, H, 0))
				}, I, H, true},
			{"experts down 8+1 slots (7168x2048)", float64(slots * I * H),
				func(s cuda.Stream, i int) {
					chk(k.ExpertsFP8(s, ey, eg, I, 1, top, [2]cuda.DevPtr{dT}, [2]cuda.DevPtr{dS}, idps[i%sets], top,
						[2]cuda.DevPtr{dW}, [2]cuda.DevPtr{dSW}, 1, H, I))
				},
				func(s cuda.Stream, i int) {
					chk(k.ExpertsFP8Bulk(s, ey, eg, I, 1, top, [2]cuda.DevPtr{dT}, [2]cuda.DevPtr{dS}, idps[i%sets], top,
						[2]cuda.DevPtr{dW}, [2]cuda.DevPtr{dSW}, 1, H, I, 0))
				}, H, I, false},
		} {
			tile := groupGraphUs(c, sets, 11, p.tile)
			G, R := tileShape(k.c.Info().SMs, p.N, p.K, 1, slots, p.pair)
			add(fmtName("tile %s G=%d R=%d%s, graph", p.what, G, R, tileVariant(G, R, p.K, 1, 1)), p.bytes, tile, "")
			for _, b := range []int{2, 1} {
				forceBulkB = b
				us := groupGraphUs(c, sets, 11, p.bulk)
				add(fmtName("bulk %s G=%d B=%d, graph", p.what, G, b), p.bytes, us, fmtName("%.2fx tile", tile/us))
			}
			forceBulkB = 0
			sweep(p.what, p.bulk, sets)
		}
	})
}
