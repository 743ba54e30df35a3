package kernels

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/tilert-go/tilert/cuda"
)

// TestKernelRouterRoute: the fused router GEMV + routing
// (cu/router_route.cu) against GemvBF16Wide then MoERoute (moe_route_rank)
// on fresh random inputs: the logits, the expert ids and their weights bit
// for bit, twice in a row (the block counter read back zero after each),
// on both models' routers, the tiny presets' shapes, every rows-a-block
// plan, with and without the bias, and with duplicated weight rows (tied
// logits, so the tie rules). Fails unless the fused kernel launched.
func TestKernelRouterRoute(t *testing.T) {
	defer func(r int) { forceGemvWideRows = r }(forceGemvWideRows)
	onGPU(t, func(c *cuda.Ctx, k *Set, a *allocs, r *rand.Rand) {
		s := c.Stream()
		cnt := a.up([]int32{0})
		before := RouterRouteLaunches()
		type cfg struct {
			E, K, topk, ngroup, topkGroup int
			norm, bias                    bool
			R, dups                       int // R: rows a block (0: the rule's); dups: weight rows copied over others
		}
		for _, cf := range []cfg{
			{256, 7168, 8, 8, 4, true, true, 0, 0}, // DeepSeek-V3.2
			{256, 7168, 8, 8, 4, true, true, 0, 24},
			{256, 6144, 8, 1, 1, true, true, 0, 0}, // GLM-5
			{256, 6144, 8, 1, 1, true, false, 0, 16},
			{256, 7168, 8, 8, 4, false, false, 2, 0},
			{256, 7168, 8, 8, 4, true, true, 4, 8},
			{256, 6144, 8, 1, 1, true, true, 8, 0},
			{64, 256, 6, 4, 2, false, true, 0, 0}, // groups of 16: the loop path
			{64, 256, 6, 4, 2, true, true, 1, 12},
			{160, 512, 8, 4, 2, true, true, 0, 4},
			{32, 128, 6, 8, 1, true, true, 0, 0}, // 4 kept experts < K: dropped ones chosen
			{96, 1024, 8, 3, 2, true, true, 2, 6},
			{40, 64, 40, 1, 1, true, true, 0, 0},
		} {
			tag := fmt.Sprintf("E=%d K=%d top%d groups %d/%d norm=%v bias=%v R=%d dups=%d", cf.E, cf.K, cf.topk, cf.ngroup,
				cf.topkGroup, cf.norm, cf.bias, cf.R, cf.dups)
			t.Run(strings.ReplaceAll(tag, " ", "_"), func(t *testing.T) {
				forceGemvWideRows = cf.R
				defer func() { forceGemvWideRows = 0 }()
				E, K := cf.E, cf.K
				name, grid := k.RouterRouteKernel(E, K)
				t.Logf("%s: %s, %d blocks", tag, name, grid)
				wv := randBF16(r, E*K, 0.05)
				for range cf.dups {
					src, dst := r.IntN(E), r.IntN(E)
					copy(wv[dst*K:(dst+1)*K], wv[src*K:(src+1)*K])
				}
				w, x := a.up(wv), a.up(randF32(r, K, 1))
				bias := cuda.DevPtr(0)
				if cf.bias {
					bias = a.up(randF32(r, E, 0.1))
				}
				lg1, idx1, wts1 := a.poisoned(E), a.poisoned(cf.topk), a.poisoned(cf.topk)
				withSmall(true, func() {
					chk(k.GemvBF16Wide(s, lg1, x, w, 0, E, K, 1, K, E))
					chk(k.MoERoute(s, idx1, wts1, lg1, bias, 1, E, cf.topk, cf.ngroup, cf.topkGroup, cf.norm, 2.5))
				})
				want := [][]byte{bytesF32(downF32(c, lg1, E)), bytesI32(downI32(c, idx1, cf.topk)), bytesF32(downF32(c, wts1, cf.topk))}
				for round := range 2 {
					lg2, idx2, wts2 := a.poisoned(E), a.poisoned(cf.topk), a.poisoned(cf.topk)
					chk(k.RouterRoute(s, RouterRoute{W: w, X: x, Logits: lg2, E: E, K: K, Bias: bias, Idx: idx2, Wts: wts2,
						TopK: cf.topk, NGroup: cf.ngroup, TopKGroup: cf.topkGroup, Norm: cf.norm, Scale: 2.5, Cnt: cnt}))
					got := [][]byte{bytesF32(downF32(c, lg2, E)), bytesI32(downI32(c, idx2, cf.topk)), bytesF32(downF32(c, wts2, cf.topk))}
					bad := 0
					for i := range want {
						bad += diffBytes(want[i], got[i])
					}
					if left := downI32(c, cnt, 1); left[0] != 0 {
						bad++
					}
					record(t, fmt.Sprintf("router + routing (%s) vs gemv_bf16_wide + moe_route_rank, round %d, %s", name, round, tag),
						"mismatched bytes + a nonzero block counter", float64(bad), 0)
				}
			})
		}
		if RouterRouteLaunches() == before {
			t.Fatal("the fused router + routing kernel never launched")
		}
	})
}

func bytesI32(v []int32) []byte {
	b, err := cuda.BytesOf(v)
	chk(err)
	return b
}

// TestRouterRouteCheck: what the launcher refuses, before any launch (no
// GPU).
func TestRouterRouteCheck(t *testing.T) {
	const p = cuda.DevPtr(1 << 20)
	testRefusals(t, func() RouterRoute {
		return RouterRoute{W: p, X: p, Logits: p, E: 256, K: 7168, Idx: p, Wts: p, TopK: 8, NGroup: 8, TopKGroup: 4,
			Norm: true, Scale: 2.5, Cnt: p}
	}, (*RouterRoute).Check, []refusal[RouterRoute]{
		{"more experts than threads", func(a *RouterRoute) { a.E = 384 }, "E must be 1..256"},
		{"K not x8", func(a *RouterRoute) { a.K = 7164 }, "multiple of 8"},
		{"top-k past E", func(a *RouterRoute) { a.TopK = 300 }, "top-k"},
		{"groups not dividing E", func(a *RouterRoute) { a.NGroup = 7 }, "not divisible"},
		{"no topk_group", func(a *RouterRoute) { a.TopKGroup = 0 }, "topk_group"},
		{"unaligned x", func(a *RouterRoute) { a.X = p + 4 }, "aligned"},
		{"no ids", func(a *RouterRoute) { a.Idx = 0 }, "expert ids"},
		{"no counter", func(a *RouterRoute) { a.Cnt = 0 }, "counter"},
	})
}

// TestRouterRouteKernelsDefined: every gemv_bf16_wide_r<R> and its fused
// twin (+ "_rt") are in the module, launched as the plain one is
// (programmatically).
func TestRouterRouteKernelsDefined(t *testing.T) {
	testTwinsDefined(t, setOf("gemv_bf16_wide_r1", "gemv_bf16_wide_r2", "gemv_bf16_wide_r4", "gemv_bf16_wide_r8"), "_rt", 4)
}

// TestKernelTimingRouterRoute (TILERT_GPU_TIMING=1): the fused router +
// routing against its two launches (GemvBF16Wide, then moe_route_rank) and
// the router GEMV alone, at both models' shapes, direct and inside a CUDA
// graph, beside a device copy of 256 MiB; bytes are the router's weights.
func TestKernelTimingRouterRoute(t *testing.T) {
	needTiming(t)
	onGPU(t, func(c *cuda.Ctx, k *Set, a *allocs, r *rand.Rand) {
		s := c.Stream()
		add := timingTable(t, c, a, r, 256<<20, "router + routing: device-to-device copy 256 MiB (read+write)", "reference of this table")
		both := directAndGraph(c, s, add)
		cnt := a.up([]int32{0})
		for _, sh := range []struct {
			name                  string
			E, K, ngroup, topkGrp int
		}{{"DeepSeek-V3.2 256x7168", 256, 7168, 8, 4}, {"GLM-5 256x6144", 256, 6144, 1, 1}} {
			E, K := sh.E, sh.K
			w, x, bias := a.up(randBF16(r, E*K, 0.05)), a.up(randF32(r, K, 1)), a.up(randF32(r, E, 0.1))
			lg, idx, wts := a.raw(int64(4*E)), a.raw(4*8), a.raw(4*8)
			name, _ := k.RouterRouteKernel(E, K)
			bytes := float64(2 * E * K)
			both(sh.name+" router alone", bytes, func() { chk(k.GemvBF16Wide(s, lg, x, w, 0, E, K, 1, K, E)) })
			withSmall(true, func() {
				both(sh.name+" router + moe_route_rank", bytes, func() {
					chk(k.GemvBF16Wide(s, lg, x, w, 0, E, K, 1, K, E))
					chk(k.MoERoute(s, idx, wts, lg, bias, 1, E, 8, sh.ngroup, sh.topkGrp, true, 2.5))
				})
			})
			both(sh.name+" "+name, bytes, func() {
				chk(k.RouterRoute(s, RouterRoute{W: w, X: x, Logits: lg, E: E, K: K, Bias: bias, Idx: idx, Wts: wts, TopK: 8,
					NGroup: sh.ngroup, TopKGroup: sh.topkGrp, Norm: true, Scale: 2.5, Cnt: cnt}))
			})
		}
	})
}
