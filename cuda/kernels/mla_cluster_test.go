package kernels

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/tilert-go/tilert/cuda"
)

// withMLACluster runs f with MLACluster set to on.
func withMLACluster(on bool, f func()) { withSetting(&MLACluster, on, f) }

// TestMLAClusterTakes: the cluster forms only for wg2b / wg2h launches whose
// ranges are whole clusters, two or more of them, and only with MLACluster.
func TestMLAClusterTakes(t *testing.T) {
	for _, tc := range []struct {
		on     bool
		name   string
		nsplit int
		want   bool
	}{
		{true, mlaDecodeWG2BName, 32, true},
		{true, mlaDecodeWG2HName, 32, true},
		{true, mlaDecodeWG2BName, 16, true},
		{true, mlaDecodeWG2BName, 8, false},  // one cluster: the combine would merge one partial
		{true, mlaDecodeWG2BName, 24, true},  // three clusters
		{true, mlaDecodeWG2BName, 20, false}, // not whole clusters
		{true, mlaDecodeWG2Name, 32, false},  // two-tile blocks keep wg2
		{false, mlaDecodeWG2BName, 32, false},
	} {
		var got bool
		withMLACluster(tc.on, func() { got = mlaClusterTakes(tc.name, tc.nsplit) })
		if got != tc.want {
			t.Errorf("MLACluster %v: mlaClusterTakes(%s, %d) = %v, want %v", tc.on, tc.name, tc.nsplit, got, tc.want)
		}
	}
}

// TestKernelMLADecodeWG2C: with MLACluster the one-tile decode MLA runs its
// cluster form (mla_decode_wg2bc / wg2hc), whose merged partials give the
// outputs and lse of wg2b / wg2h within float32 reassociation (relative
// 2^-18 of the row's largest value) and within the one-fp16-part bound of
// float64, a repeated launch bit for bit, on fresh random inputs: one row of
// 128 heads (DeepSeek-V3.2 dims, 32 ranges: 4 clusters), one row of 64
// (GLM-5 dims on 32-head blocks), 48 heads (a last block of 16), 1024
// selections (16 ranges: 2 clusters), rows through per-row cache bases, four
// rows of 32-head blocks (one row without a valid selection, one with five:
// empty clusters), and a launch of 8 ranges that keeps the plain form. Fails unless the counter
// saw the cluster launches.
func TestKernelMLADecodeWG2C(t *testing.T) {
	onGPU(t, func(c *cuda.Ctx, k *Set, a *allocs, r *rand.Rand) {
		needWG(t, c, k)
		s := c.Stream()
		n0 := MLAClusterLaunches.Load()
		for _, cs := range []struct {
			nq, H, nidx int
			split       int // 0: MLAWG2Splits
			bases       bool
			cluster     bool // the launch takes the cluster form
			hpb         int  // MLAHeadsPerBlock (0: the default)
		}{{1, 128, 2048, 0, false, true, 0}, {1, 64, 2048, 0, false, true, 0}, {1, 48, 2048, 0, false, true, 0},
			{1, 128, 1024, 16, false, true, 0}, {2, 64, 2048, 32, true, true, 0}, {1, 128, 512, 8, false, false, 0},
			// Four rows on wg2h: newH1Case's row 1 has no valid selection
			// (every cluster empty) and row 3 five in the first positions
			// (its later clusters empty).
			{4, 32, 2048, 32, false, true, 32}} {
			cc := newH1Case(r, cs.nq, cs.H, cs.nidx, cs.nidx, 0.07)
			ns := cs.split
			if ns == 0 {
				ns = k.MLAWG2Splits(cs.nq, cs.H, cs.nidx)
			}
			cache, rb := cc.rowCaches(c, a, cs.nq, cs.bases)
			ws := a.raw(MLAWorkspaceBytes(cs.nq, cs.H, ns) + 4)
			qn, qp, ip, lp := a.up(cc.qn), a.up(cc.qp), a.up(cc.idx), a.up(cc.lens)
			n := cs.nq * cs.H
			var base string
			withHeadsPerBlock(cs.hpb, func() { base = wg2Name(cs.nq, cs.H, cs.nidx, ns) })
			name := fmt.Sprintf("%s (cluster %v) nq=%d H=%d nidx=%d split=%d bases=%v", base, cs.cluster, cs.nq, cs.H, cs.nidx, ns, cs.bases)
			run := func(on bool) ([]float32, []float32) {
				op, lsp := a.poisoned(n*512), a.poisoned(n)
				withHeadsPerBlock(cs.hpb, func() {
					withMLACluster(on, func() {
						chk(k.MLADecodeWG2(s, op, lsp, qn, qp, cache, 0, rb, ip, lp, ws, cs.nq, cs.H, cs.nidx, cs.nidx, ns, cc.scale))
					})
				})
				return downF32(c, op, n*512), downF32(c, lsp, n)
			}
			nb := MLAClusterLaunches.Load()
			got, gotL := run(true)
			if took := MLAClusterLaunches.Load() != nb; took != cs.cluster {
				t.Errorf("%s: cluster form taken %v", name, took)
			}
			ref, refL := run(false)
			if !cs.cluster {
				record(t, name+" vs the plain form", "values differing (bits)", float64(bitDiff(got, ref)+bitDiff(gotL, refL)), 0)
				continue
			}
			// Per row of heads: |d| against the row's largest |value|.
			var worst float64
			for h := range n {
				var dmax, vmax float64
				for i := h * 512; i < (h+1)*512; i++ {
					d := math.Abs(float64(got[i] - ref[i]))
					if math.IsNaN(float64(got[i])) {
						d = math.Inf(1)
					}
					dmax = max(dmax, d)
					vmax = max(vmax, math.Abs(float64(ref[i])))
				}
				worst = max(worst, dmax/max(vmax, 1e-30))
			}
			record(t, name+" vs the plain form", "max |d|/max|v| a head", worst, math.Ldexp(1, -18))
			var dl float64
			for i := range gotL {
				if gotL[i] == refL[i] { // both -inf on a row without a valid selection
					continue
				}
				dl = max(dl, math.Abs(float64(gotL[i]-refL[i]))/max(math.Abs(float64(refL[i])), 1))
			}
			record(t, name+" lse vs the plain form", "max |d|/max(1, |lse|)", dl, math.Ldexp(1, -18))
			again, againL := run(true)
			record(t, name+" repeated", "values differing (bits)", float64(bitDiff(got, again)+bitDiff(gotL, againL)), 0)
			we, wh, wl, _ := cc.check(got, gotL)
			record(t, name+" vs float64", "max |d|/bound (one fp16 part)", we, 1)
			record(t, name+" vs kernel-rounded inputs", "max |d|/bound (fp16 P, float32)", wh, 1)
			record(t, name+" (lse)", "max |d|/bound", wl, 1)
		}
		if MLAClusterLaunches.Load() == n0 {
			t.Fatal("no cluster-merged launch was counted")
		}
	})
}
