package kernels

import (
	"math"
	"math/rand/v2"
	"os"
	"testing"

	"github.com/tilert-go/tilert/cuda"
)

// TestKernelMLATCF: mla_decode_tcf, tcf2 and tcf8 (split + combine)
// against mla_decode_tcp on fresh random inputs at the
// serving shapes (128 heads x 2048 of 8192 tokens, the TP-8 shards' 16
// and 8 heads, several rows, partial head groups): float32 rounding apart
// (the products are float32-exact in both; tcf sums in another order). Every
// output written (poisoned before), and two runs bit-identical. The engine's
// per-row cache bases (slots) against one launch per row. TestKernelMLA
// checks both against float64.
func TestKernelMLATCF(t *testing.T) {
	onGPU(t, func(c *cuda.Ctx, k *Set, a *allocs, r *rand.Rand) {
		s := c.Stream()
		if c.Info().CCMajor < 9 {
			t.Skip("mla_decode_tcf needs sm_90")
		}
		const nidx, T = 2048, 8192
		cache := devMLACache(c, a, r, T)
		diff := func(got, want []float32) float64 {
			var worst, scale float64
			for j, v := range want {
				scale = math.Max(scale, math.Abs(float64(v)))
				d := math.Abs(float64(got[j]) - float64(v))
				if math.IsNaN(d) {
					d = math.Inf(1)
				}
				worst = math.Max(worst, d)
			}
			return worst / scale
		}
		for _, cs := range []struct{ nq, H, nsplit int }{{1, 128, 32}, {1, 128, 1}, {1, 16, 64}, {1, 8, 64}, {2, 20, 5}, {3, 40, 7}, {4, 128, 8}, {1, 24, 13}} {
			qn, qp, ip, lens, _ := devMLAQueries(a, r, cs.nq, cs.H, nidx, T)
			ws := a.raw(MLAWorkspaceBytes(cs.nq, cs.H, mlaHeadsSplits))
			n := cs.nq*cs.H*MLALatentDim + cs.nq*cs.H
			run := func(f func(out, lse cuda.DevPtr)) []float32 {
				out, lse := a.poisoned(cs.nq*cs.H*MLALatentDim), a.poisoned(cs.nq*cs.H)
				f(out, lse)
				return append(downF32(c, out, cs.nq*cs.H*MLALatentDim), downF32(c, lse, cs.nq*cs.H)...)
			}
			want := run(func(out, lse cuda.DevPtr) {
				chk(k.MLADecodeTCP(s, out, lse, qn, qp, cache, 0, ip, lens, ws, cs.nq, cs.H, nidx, nidx, cs.nsplit, 0.07))
			})
			tcf := func(out, lse cuda.DevPtr) {
				chk(k.MLADecodeTCF(s, MLATCF3, out, lse, qn, qp, cache, 0, 0, ip, lens, ws, cs.nq, cs.H, nidx, nidx, cs.nsplit, 0.07))
			}
			got, again := run(tcf), run(tcf)
			record(t, fmtName("mla_decode_tcf vs tcp nq=%d H=%d split=%d", cs.nq, cs.H, cs.nsplit), "max|d|/max|tcp|", diff(got, want), 1e-5)
			bad := 0
			for j := range n {
				if math.Float32bits(got[j]) != math.Float32bits(again[j]) {
					bad++
				}
			}
			record(t, fmtName("mla_decode_tcf repeat nq=%d H=%d split=%d", cs.nq, cs.H, cs.nsplit), "mismatched outputs", float64(bad), 0)
			for _, d := range []mlaTiled{mlaTCF8Kernel, mlaTCF2Kernel} {
				g := run(func(out, lse cuda.DevPtr) {
					chk(k.launchMLATiledRows(d, s, out, lse, qn, qp, cache, 0, ip, lens, ws, 0, cs.nq, cs.H, nidx, nidx, cs.nsplit, 0.07, true, true))
				})
				record(t, fmtName("%s vs tcp nq=%d H=%d split=%d", d.name, cs.nq, cs.H, cs.nsplit), "max|d|/max|tcp|", diff(g, want), 1e-5)
			}
		}
		// Per-row cache bases: rows on different regions, one launch ==
		// one launch per row (same kernel, same bits).
		const nq, H = 3, 128
		regions := []cuda.DevPtr{devMLACache(c, a, r, T), cache, devMLACache(c, a, r, T)}
		base := make([]int64, nq)
		for i, p := range regions {
			base[i] = int64(p) - int64(cache)
		}
		bp := a.up(base)
		qn, qp, ip, lens, _ := devMLAQueries(a, r, nq, H, nidx, T)
		ws := a.raw(MLAWorkspaceBytes(nq, H, mlaHeadsSplits))
		ns := k.MLATCSplits(nq, H, nidx)
		qAt := func(p cuda.DevPtr, i, w int) cuda.DevPtr { return p.Add(int64(4 * i * H * w)) }
		for _, v := range []MLATCF{MLATCF3, MLATCF2, MLATCF8} {
			rowsOut, perOut := a.poisoned(nq*H*MLALatentDim), a.poisoned(nq*H*MLALatentDim)
			chk(k.MLADecodeTCF(s, v, rowsOut, 0, qn, qp, cuda.DevPtr(int64(cache)), 0, bp, ip, lens, ws, nq, H, nidx, nidx, ns, 0.07))
			for i := range nq {
				chk(k.MLADecodeTCF(s, v, qAt(perOut, i, MLALatentDim), 0, qAt(qn, i, MLALatentDim), qAt(qp, i, MLARopeDim), regions[i], 0, 0,
					ip.Add(int64(4*i*nidx)), lens.Add(int64(4*i)), ws, 1, H, nidx, nidx, k.MLATCSplits(1, H, nidx), 0.07))
			}
			a1, per := downF32(c, rowsOut, nq*H*MLALatentDim), downF32(c, perOut, nq*H*MLALatentDim)
			record(t, fmtName("%s rows (3 slots) vs one launch per row", v.kernel().name), "max|d|/max|row|", diff(a1, per), 1e-5)
		}
	})
}

// TestKernelTimingMLATCF (TILERT_GPU_TIMING=1): graph-timed sparse MLA
// decode, 2048 selected of 131072 tokens (86 MB of cache, more than the L2),
// 8 query sets rotating: tc (the engine's default before tcf), tcp, tcf
// (three parts), tcf2 (two parts: the engine's default) and tcf8 at the
// planned split and its neighbours; 1 and 4 rows of 128 heads and the
// TP-8 shards' 16 (DeepSeek) and 8 (GLM) heads. (The cluster-merged tcq /
// tcfq / tcf2q, timed in session 4's run 1 at 1.5-2.5x tcf2's time, were
// removed in session 12; last in 0781d7c. tcf's stage-dropped diagnostics
// mla_decode_tcf_d1..d3 went in session 54.)
func TestKernelTimingMLATCF(t *testing.T) {
	needTiming(t)
	onGPU(t, func(c *cuda.Ctx, k *Set, a *allocs, r *rand.Rand) {
		s := c.Stream()
		add := timingTable(t, c, a, r, 256<<20, "device-to-device copy 256 MiB (read+write)", "reference of this table")
		if c.Info().CCMajor < 9 {
			t.Skip("mla_decode_tcf needs sm_90")
		}
		const nidx, T = 2048, 131072
		cache := devMLACache(c, a, r, T)
		const sets = 8
		for _, sh := range []struct{ nq, H int }{{1, 128}, {1, 16}, {1, 8}, {4, 128}} {
			nq, H := sh.nq, sh.H
			var qn, qp, lens, out, ip [sets]cuda.DevPtr
			for i := range sets {
				qn[i], qp[i], ip[i], lens[i], out[i] = devMLAQueries(a, r, nq, H, nidx, T)
			}
			ws := a.raw(MLAWorkspaceBytes(nq, H, mlaHeadsSplits))
			nb := float64(nq * (nidx*MLATokenBytes + 4*H*(512+64+512)))
			ns := k.MLATCSplits(nq, H, nidx)
			for _, d := range []mlaTiled{mlaTCKernel, mlaTCPKernel, mlaTCFKernel, mlaTCF2Kernel, mlaTCF8Kernel} {
				sps := []int{ns}
				if d.name != mlaTCKernel.name && d.name != mlaTCPKernel.name {
					sps = []int{ns / 2, ns, 2 * ns}
				}
				for _, sp := range sps {
					if sp < 1 || sp > mlaHeadsSplits {
						continue
					}
					us := graphUsRot(c, s, 8, 15, func(i int) {
						chk(k.launchMLATiledParts(d, s, out[i], 0, qn[i], qp[i], cache, 0, ip[i], lens[i], ws, nq, H, nidx, nidx, sp, 0.1, true, true))
					})
					add(fmtName("graph: %s nq=%d H=%d split=%d", d.name, nq, H, sp), nb, us, "decode + combine")
					if sp == ns {
						us = graphUsRot(c, s, 8, 15, func(i int) {
							chk(k.launchMLATiledParts(d, s, out[i], 0, qn[i], qp[i], cache, 0, ip[i], lens[i], ws, nq, H, nidx, nidx, sp, 0.1, true, false))
						})
						add(fmtName("graph: %s nq=%d H=%d split=%d decode only", d.name, nq, H, sp), nb, us, "")
					}
				}
			}
		}
	})
}

// TestKernelProfileMLA (TILERT_GPU_PROFILE_MLA=1): one launch each of the
// tensor-core MLA decodes at 128 heads x 2048 tokens (1 row, the planned
// split), 64 heads and the 16-head shard (mla_decode_wg2 + combine twice where
// it runs), for a profiler run (ncu -k regex:mla_).
func TestKernelProfileMLA(t *testing.T) {
	if os.Getenv("TILERT_GPU_PROFILE_MLA") != "1" {
		t.Skip("TILERT_GPU_PROFILE_MLA=1 launches the MLA decodes once each for a profiler")
	}
	onGPU(t, func(c *cuda.Ctx, k *Set, a *allocs, r *rand.Rand) {
		s := c.Stream()
		const nidx, T = 2048, 131072
		cache := devMLACache(c, a, r, T)
		for _, H := range []int{128, 64, 16} {
			qn, qp, ip, lens, out := devMLAQueries(a, r, 1, H, nidx, T)
			ws := a.raw(MLAWorkspaceBytes(1, H, mlaHeadsSplits))
			ns := k.MLATCSplits(1, H, nidx)
			for _, d := range []mlaTiled{mlaTCKernel, mlaTCPKernel, mlaTCFKernel, mlaTCF8Kernel} {
				chk(k.launchMLATiled(d, s, out, 0, qn, qp, cache, 0, ip, lens, ws, 1, H, nidx, nidx, ns, 0.1))
			}
			if k.WGSupported() == nil && H >= 64 {
				// The decode default for 128 heads (engine mlaWGRule), twice:
				// the second launch finds its code and the cache's page tables warm.
				wws := a.raw(MLAWorkspaceBytes(1, H, mlaWG2MaxSplits))
				for range 2 {
					chk(k.MLADecodeWG2(s, out, 0, qn, qp, cache, 0, 0, ip, lens, wws, 1, H, nidx, nidx, k.MLAWG2Splits(1, H, nidx), 0.1))
				}
			}
			chk(c.SyncStream(s))
		}
	})
}
