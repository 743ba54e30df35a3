package kernels

import (
	"fmt"
	"math/rand/v2"
	"regexp"
	"strconv"
	"testing"

	"github.com/tilert-go/tilert/cuda"
)

// The fused MoE combine + add + RMSNorm (moe_combine_norm_cl,
// MoECombineNorm) against moe_combine_slots then add_rmsnorm_reg.

// TestMoENormShape: the Go side's constants are the kernel's, and the
// shapes that take the one launch are add_rmsnorm_reg's with k <= 8.
func TestMoENormShape(t *testing.T) {
	src := KernelSource()
	for name, want := range map[string]int{"MCN_CL": moeNormCluster, "MCN_KMAX": moeNormKMax, "NORM_REGS": normRegs} {
		m := regexp.MustCompile(`#define ` + name + ` (\d+)`).FindStringSubmatch(src)
		if m == nil {
			t.Fatalf("%s not defined in the module", name)
		}
		if v, _ := strconv.Atoi(m[1]); v != want {
			t.Errorf("%s = %d in the kernels, %d in Go", name, v, want)
		}
	}
	if !regexp.MustCompile(`__cluster_dims__\(MCN_CL, 1, 1\) __launch_bounds__\(128\)\s+moe_combine_norm_cl\(`).MatchString(src) {
		t.Errorf("moe_combine_norm_cl is not a cluster of MCN_CL blocks of at most 128 threads")
	}
	withSmall(true, func() {
		for _, c := range []struct {
			k, N, block int
			ok          bool
		}{
			{8, 7168, 128, true}, {8, 6144, 128, true}, {6, 7168, 128, true}, {1, 1536, 64, true},
			{8, 100, 32, true}, {8, 33, 32, true}, {8, 1000, 32, true}, {8, 8192, 128, true},
			{9, 7168, 128, false}, {0, 7168, 128, false}, {8, 8193, 128, false},
		} {
			if got := moeNormShapeOK(c.k, c.N); got != c.ok {
				t.Errorf("k=%d N=%d: one launch %v, want %v", c.k, c.N, got, c.ok)
			}
			// The block holds normThreads(N)/32 warps spread over the cluster.
			if b := moeNormBlock(c.N); b != c.block || b*moeNormCluster < normThreads(c.N) || b > 128 {
				t.Errorf("N=%d: block %d, want %d (covering %d threads)", c.N, b, c.block, normThreads(c.N))
			}
		}
	})
	withSmall(false, func() {
		if moeNormShapeOK(8, 7168) {
			t.Errorf("TILERT_GPU_SMALL=0 (the loop add_rmsnorm) must take the two launches")
		}
	})
}

// TestMoENormArgs: bad arguments are refused before anything launches (a
// nil Set: no device touched).
func TestMoENormArgs(t *testing.T) {
	var k *Set
	p := func(i int) cuda.DevPtr { return cuda.DevPtr(0x1000 * i) }
	for _, c := range []struct {
		name                 string
		ny, x, out, y, w, nw cuda.DevPtr
		M, kslots, N         int
	}{
		{"M 0", p(1), p(2), p(3), p(4), p(5), p(6), 0, 8, 7168},
		{"M too many", p(1), p(2), p(3), p(4), p(5), p(6), 65536, 8, 7168},
		{"k 0", p(1), p(2), p(3), p(4), p(5), p(6), 1, 0, 7168},
		{"N 0", p(1), p(2), p(3), p(4), p(5), p(6), 1, 8, 0},
		{"null y", 0, p(2), p(3), p(4), p(5), p(6), 1, 8, 7168},
		{"null x", p(1), 0, p(3), p(4), p(5), p(6), 1, 8, 7168},
		{"null out", p(1), p(2), 0, p(4), p(5), p(6), 1, 8, 7168},
		{"null slots", p(1), p(2), p(3), 0, p(5), p(6), 1, 8, 7168},
		{"null weights", p(1), p(2), p(3), p(4), 0, p(6), 1, 8, 7168},
		{"null norm", p(1), p(2), p(3), p(4), p(5), 0, 1, 8, 7168},
		{"y is x", p(2), p(2), p(3), p(4), p(5), p(6), 1, 8, 7168},
		{"y is out", p(3), p(2), p(3), p(4), p(5), p(6), 1, 8, 7168},
		{"x is out", p(1), p(3), p(3), p(4), p(5), p(6), 1, 8, 7168},
	} {
		err := k.MoECombineNorm(0, c.ny, c.x, c.out, c.y, c.w, 0, c.nw, c.M, c.kslots, c.N, 1e-6)
		if err == nil {
			t.Errorf("%s: accepted", c.name)
		}
	}
	if err := moeNormCheck(p(1), p(2), p(3), p(4), p(5), p(6), 8, 8, 7168); err != nil {
		t.Errorf("valid arguments refused: %v", err)
	}
}

// TestKernelMoECombineNorm: the fused launch against moe_combine_slots +
// add_rmsnorm_reg, bit for bit (out, x, y), on fresh random inputs: the
// engine's shapes (7168 DeepSeek-V3.2, 6144 GLM-5, 8 slots, the shared
// expert as resid or none), 1..8 rows, odd and small rows (fewer warps
// than the cluster's blocks), and k past 8 (the two launches); again on a
// second launch and over three replays of a captured graph.
func TestKernelMoECombineNorm(t *testing.T) {
	onGPU(t, func(c *cuda.Ctx, k *Set, a *allocs, r *rand.Rand) {
		s := c.Stream()
		sm90 := c.Info().CCMajor >= 9
		const eps = 1e-6
		type res struct{ out, x, y []float32 }
		for _, cs := range []struct{ N, K int }{
			{7168, 8}, {6144, 8}, {1536, 8}, {8192, 8}, {7168, 6}, {1000, 8}, {100, 8}, {33, 3}, {7168, 10},
		} {
			for _, M := range []int{1, 2, 4, 8} {
				for _, withRes := range []bool{true, false} {
					N, K := cs.N, cs.K
					y := a.up(randF32(r, M*(K+1)*N, 1)) // the slots, then the shared expert's rows
					ew := a.up(randF32(r, M*K, 0.3))
					nw := a.up(randF32(r, N, 1))
					x0 := randF32(r, M*N, 3)
					resid := cuda.DevPtr(0)
					if withRes {
						resid = y.Add(int64(4 * M * K * N))
					}
					run := func(fused bool) res {
						x, out, ny := a.up(x0), a.poisoned(M*N), a.poisoned(M*N)
						if fused {
							chk(k.MoECombineNorm(s, ny, x, out, y, ew, resid, nw, M, K, N, eps))
						} else {
							chk(k.MoECombineSlots(s, out, y, ew, resid, M, K, N))
							chk(k.AddRMSNorm(s, ny, x, out, nw, M, N, N, N, N, eps))
						}
						return res{downF32(c, out, M*N), downF32(c, x, M*N), downF32(c, ny, M*N)}
					}
					diff := func(a, b res) int {
						return diffF32Bits(a.out, b.out) + diffF32Bits(a.x, b.x) + diffF32Bits(a.y, b.y)
					}
					want := run(false)
					got := run(true)
					again := run(true)
					// Three replays of a graph of the fused launch, x reset before each.
					x, out, ny := a.raw(int64(4*M*N)), a.poisoned(M*N), a.poisoned(M*N)
					chk(c.SyncStream(s))
					chk(c.BeginCapture(s))
					chk(k.MoECombineNorm(s, ny, x, out, y, ew, resid, nw, M, K, N, eps))
					g, err := c.EndCapture(s)
					chk(err)
					bad := 0
					for range 3 {
						chk(c.Upload(x, x0))
						chk(c.MemsetD32(ny, 0x7fc00000, int64(M*N), s))
						chk(c.LaunchGraph(g, s))
						chk(c.SyncStream(s))
						bad += diff(res{downF32(c, out, M*N), downF32(c, x, M*N), downF32(c, ny, M*N)}, want)
					}
					chk(c.DestroyGraph(g))
					one := k.MoENormFused(K, N)
					if sm90 && (N == 7168 || N == 6144) && K <= 8 && !one {
						t.Errorf("N=%d k=%d: two launches on an sm_90 device", N, K)
					}
					tag := fmt.Sprintf("N=%d k=%d M=%d resid=%v one launch=%v", N, K, M, withRes, one)
					record(t, "moe_combine_norm_cl vs moe_combine_slots + add_rmsnorm "+tag, "mismatched values", float64(diff(got, want)), 0)
					record(t, "moe_combine_norm_cl second launch "+tag, "mismatched values", float64(diff(again, want)), 0)
					record(t, "moe_combine_norm_cl graph x3 "+tag, "mismatched values", float64(bad), 0)
				}
			}
		}
	})
}

// TestKernelMoECombineNormTiming graph-times the two launches against the
// fused one at the engine's shapes (20 launches a graph, the decode step's
// situation; x grows by the combine each launch, as in a forward).
func TestKernelMoECombineNormTiming(t *testing.T) {
	needTiming(t)
	onGPU(t, func(c *cuda.Ctx, k *Set, a *allocs, r *rand.Rand) {
		s := c.Stream()
		add := timingTable(t, c, a, r, 256<<20, "moe norm: device-to-device copy 256 MiB (read+write)", "reference of this table")
		const topk = 8
		for _, D := range []int{7168, 6144} {
			for _, M := range []int{1, 4} {
				y := a.up(randF32(r, M*(topk+1)*D, 1))
				ew := a.up(randF32(r, M*topk, 0.3))
				res := y.Add(int64(4 * M * topk * D))
				nw := a.up(randF32(r, D, 1))
				xr, out, mo := a.up(randF32(r, M*D, 1)), a.raw(int64(4*M*D)), a.raw(int64(4*M*D))
				bytes := float64(4 * M * D * (topk + 5))
				add(fmtName("moe_combine_slots + add_rmsnorm (2 launches) D=%d M=%d graph", D, M), bytes, graphUs(c, s, 20, func() {
					chk(k.MoECombineSlots(s, mo, y, ew, res, M, topk, D))
					chk(k.AddRMSNorm(s, out, xr, mo, nw, M, D, D, D, D, 1e-6))
				}), "")
				add(fmtName("moe_combine_norm_cl (fused) D=%d M=%d graph", D, M), bytes, graphUs(c, s, 20, func() {
					chk(k.MoECombineNorm(s, out, xr, mo, y, ew, res, nw, M, topk, D, 1e-6))
				}), fmt.Sprintf("one launch %v", k.MoENormFused(topk, D)))
			}
		}
	})
}
