package kernels

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/tilert-go/tilert/cuda"
)

// TestKernelMMATiming times the tensor-core GEMVs against the engine's
// GEMVs before them (the tile GEMV for fp8 and paired gate/up, the
// warp-per-row bf16 GEMV in chunks of 4 rows for the head) on the decode
// shapes for M = 1, 2, 4, 8 rows, each call graph-timed with the weights
// cold, and logs a sweep of row tiles / chunks in flight. Reported, never
// asserted (TILERT_GPU_TIMING=1).
func TestKernelMMATiming(t *testing.T) {
	needTiming(t)
	defer func() { forceMMART, forceMMAU, forceMMAP, forceMMAX = 0, 0, -1, -1 }()
	onGPU(t, func(c *cuda.Ctx, k *Set, a *allocs, r *rand.Rand) {
		s := c.Stream()
		add := timingTable(t, c, a, r, 1<<30, "mma: device-to-device copy 1 GiB (read+write)", "reference")
		if !k.MMAOK(a.raw(64), a.raw(64), 64, 64, 1, 1) {
			t.Skip("no bf16 mma.sync")
		}
		x := a.up(randF32(r, MaxTileM*18432, 1))
		y := a.raw(int64(4 * MaxTileM * 129280))
		// one shape: old(i, M) and mma(i, M) run copy i of the weights.
		shape := func(what string, N, K int, bf16, pair bool, wbytes int64, nc int, old, mma func(i, M int)) {
			inner := max(2, min(16, nc))
			var one float64
			line := ""
			for _, M := range []int{1, 2, 4, 8} {
				bytes := float64(wbytes) + float64(4*M*(K+N))
				o := graphUsRot(c, s, inner, 7, func(i int) { old(i%nc, M) })
				add(fmtName("%s N=%d K=%d M=%d before", what, N, K, M), bytes, o, "")
				if M == 1 {
					one = o
				}
				forceMMART, forceMMAU, forceMMAP, forceMMAX = 0, 0, -1, -1
				m := graphUsRot(c, s, inner, 7, func(i int) { mma(i%nc, M) })
				esz := 1
				if bf16 {
					esz = 2
				}
				v := mmaShape(k.c.Info().SMs, N, K*esz, bf16, pair)
				add(fmtName("%s N=%d K=%d M=%d %s", what, N, K, M, v.name(bf16)), bytes, m,
					fmtName("%.2fx before, %.2fx before M=1", o/m, m/one))
				if M == 1 {
					continue
				}
				line += fmt.Sprintf(" | M=%d", M)
				for _, v := range mmaAllVariants() {
					if (pair && v.RT < 2) || !mmaCompiled(v, bf16) {
						continue
					}
					forceMMART, forceMMAU, forceMMAP, forceMMAX = v.RT, v.U, v.P, b2i(v.X)
					us := graphUsRot(c, s, inner, 5, func(i int) { mma(i%nc, M) })
					line += fmt.Sprintf(" %s:%.1f", strings.TrimPrefix(v.name(bf16), "gemv_"), us)
				}
				forceMMART, forceMMAU, forceMMAP, forceMMAX = 0, 0, -1, -1
			}
			t.Logf("mma sweep %s N=%d K=%d us:%s", what, N, K, line)
		}
		fp8 := func(what string, N, K int) {
			nc := coldCopies(int64(N * K))
			ws, ss := devFP8s(c, a, r, nc, N, K)
			shape(what, N, K, false, false, int64(N*K+4*cdiv(N, 128)*cdiv(K, 128)), nc,
				func(i, M int) { chk(k.GemvFP8Tile(s, y, x, ws[i], ss[i], 0, N, K, M, K, N)) },
				func(i, M int) { chk(k.GemvFP8MMA(s, y, x, ws[i], ss[i], 0, N, K, M, K, N)) })
		}
		fp8("o_proj", 7168, 16384)
		fp8("q_b", 24576, 1536)
		fp8("idx wq_b", 8192, 1536)
		fp8("dense down", 7168, 18432)
		fp8("q_a", 1536, 7168)
		{
			// The attention inputs of a layer: q_a, kv_a, indexer wk (fp8),
			// indexer weights_proj (bf16) over the same rows.
			const K = 7168
			Ns := []int{1536, 576, 128, 64}
			nc := coldCopies(int64(2304 * K))
			sets := make([][]GroupSeg, nc)
			for i := range sets {
				for j, N := range Ns {
					if j == 3 {
						sets[i] = append(sets[i], GroupSeg{W: devBF16s(c, a, r, 1, N, K)[0], Y: y.Add(int64(4 * 8 * 4096 * j)), N: N, LdY: N, BF16: true})
						continue
					}
					w, sc := devFP8(c, a, r, N, K)
					sets[i] = append(sets[i], GroupSeg{W: w, S: sc, Y: y.Add(int64(4 * 8 * 4096 * j)), N: N, LdY: N})
				}
			}
			old := func(i, M int) { chk(k.GemvGroup(s, x, K, M, K, sets[i], GroupNorm{})) }
			mma := func(i, M int) { chk(k.GemvGroupMMA(s, x, K, M, K, sets[i])) }
			inner := max(2, min(16, nc))
			for _, M := range []int{1, 2, 4, 8} {
				bytes := float64((1536+576+128)*K + 2*64*K + 4*M*(K+2304))
				o := graphUsRot(c, s, inner, 7, func(i int) { old(i%nc, M) })
				add(fmtName("attn-in group 2304x%d M=%d before", K, M), bytes, o, "")
				for _, u := range []int{2, 4} {
					forceMMAU = u
					m := graphUsRot(c, s, inner, 7, func(i int) { mma(i%nc, M) })
					add(fmtName("attn-in group 2304x%d M=%d mma U=%d P=0", K, M, u), bytes, m, fmtName("%.2fx before", o/m))
				}
				forceMMAU = 0
			}
		}
		{
			const N, K = 18432, 7168
			nc := coldCopies(int64(2 * N * K))
			wg, sg := devFP8s(c, a, r, nc, N, K)
			wu, su := devFP8s(c, a, r, nc, N, K)
			shape("dense gate/up", N, K, false, true, int64(2*N*K), nc,
				func(i, M int) { chk(k.GateUpFP8(s, y, x, wg[i], sg[i], wu[i], su[i], N, K, M, K, N)) },
				func(i, M int) { chk(k.GateUpFP8MMA(s, y, x, wg[i], sg[i], wu[i], su[i], N, K, M, K, N)) })
		}
		{
			const N, K = 129280, 7168
			ws := devBF16s(c, a, r, 1, N, K)
			shape("head bf16", N, K, true, false, int64(2*N*K), 1,
				func(i, M int) {
					for r0 := 0; r0 < M; r0 += 4 {
						chk(k.GemvBF16(s, y.Add(int64(4*r0*N)), x.Add(int64(4*r0*K)), ws[0], 0, N, K, min(4, M-r0), K, N))
					}
				},
				func(i, M int) { chk(k.GemvBF16MMA(s, y, x, ws[0], 0, N, K, M, K, N)) })
		}
	})
}
