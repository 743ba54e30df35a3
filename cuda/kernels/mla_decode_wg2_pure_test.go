package kernels

// mla_decode_wg2 without a GPU: mla_prefill_wg2's transcription (wgBlock
// with the producer's tiles) run as the decode kernel's split blocks (the
// DEC block of cu/wg/mla_prefill_wg2.cu: a range of the selections, the
// unnormalised partial) and merged as mla_combine_wide merges them. The
// merge must stay within mla_prefill_h1's bounds and near the unsplit
// block; planted mistakes in the split logic must fail them.

import (
	"math"
	"math/rand/v2"
	"strings"
	"testing"
)

// wg2Combine transcribes mla_combine_wide over n partials a (row, head).
func wg2Combine(po, pml []float32, nqh, n int) (out, lse []float32) {
	ninf := float32(math.Inf(-1))
	out, lse = make([]float32, nqh*512), make([]float32, nqh)
	w := make([]float32, n)
	for qh := range nqh {
		M := ninf
		for z := range n {
			M = max(M, pml[2*(qh*n+z)])
		}
		var L float32
		for z := range n {
			m := pml[2*(qh*n+z)]
			w[z] = 0
			if m != ninf {
				w[z] = float32(math.Exp(float64(m - M)))
			}
			L += pml[2*(qh*n+z)+1] * w[z]
		}
		inv := float32(0)
		if L > 0 {
			inv = 1 / L
		}
		for d := range 512 {
			var acc float32
			for z := range n {
				acc = float32(math.FMA(float64(po[(qh*n+z)*512+d]), float64(w[z]), float64(acc)))
			}
			out[qh*512+d] = acc * inv
		}
		lse[qh] = ninf
		if L > 0 {
			lse[qh] = M + float32(math.Log(float64(L)))
		}
	}
	return out, lse
}

// wg2DecodeTranscribe runs the split blocks (nsplit as MLADecodeWG2 plans
// its ranges) and the merge.
func wg2DecodeTranscribe(t *testing.T, c *h1Case, nsplit, bad int) (out, lse []float32, n int) {
	tps := cdiv(cdiv(c.nidx, nsplit), 64) * 64
	n = cdiv(c.nidx, tps)
	nqh := c.nq * c.H
	po, pml := make([]float32, nqh*n*512), make([]float32, 2*nqh*n)
	for i := range po {
		po[i] = float32(math.NaN())
	}
	for i := range pml {
		pml[i] = float32(math.NaN())
	}
	for x := range n {
		kn := wgKnobs{wg2: true, part: &wgPart{begin: x * tps, x: x, n: n, o: po, ml: pml, bad: bad}}
		for qi := range c.nq {
			for z := range cdiv(c.H, 64) {
				wgBlock(t, c, kn, qi, z, tps, nil, nil)
			}
		}
	}
	out, lse = wg2Combine(po, pml, nqh, n)
	return out, lse, n
}

func TestMLADecodeWG2Transcribed(t *testing.T) {
	src := WGKernelSource()
	for _, l := range []string{
		"const int begin = DEC ? (int)blockIdx.x * tps : 0;",
		"const int count = min(indices ? nidx : len, begin + tps);",
		"mw2_token(indices, ld_idx, qi, count, begin + (k + 1) * MWG_T + pt)",
		"const size_t pz = ((size_t)qi * H + h) * gridDim.x + blockIdx.x;",
		"part_ml[2 * pz] = m == NEG_INF ? NEG_INF : m * 0.6931471805599453f;",
		"part_ml[2 * pz + 1] = lsum[hb] + lsum[MWG_HB + hb];",
		"mw2_block<4, 8, MW2_PREG, MW2_CREG, true>(",
	} {
		if !strings.Contains(src, l) {
			t.Errorf("transcribed line no longer in cu/wg/mla_prefill_wg2.cu: %s", l)
		}
	}
	r := rand.New(rand.NewPCG(19, 5))
	for _, cs := range []struct{ nq, H, nidx, ldIdx, split int }{{2, 128, 300, 304, 3}, {4, 72, 150, 160, 2}, {3, 4, 512, 512, 8}, {1, 64, 2048, 2048, 32}} {
		c := newH1Case(r, cs.nq, cs.H, cs.nidx, cs.ldIdx, 0.1)
		wo, _ := wgTranscribe(t, c, wgKnobs{wg2: true})
		out, lse, n := wg2DecodeTranscribe(t, c, cs.split, 0)
		we, wh, wl, _ := c.check(out, lse)
		var dmax, vmax float64
		for i := range wo {
			dmax = max(dmax, math.Abs(float64(out[i]-wo[i])))
			vmax = max(vmax, math.Abs(float64(wo[i])))
		}
		rel := dmax / max(vmax, 1e-30)
		t.Logf("nq=%d H=%d nidx=%d, %d splits: |d|/bound exact %.3g, emulated %.3g, lse %.3g; against the unsplit block %.3g relative",
			cs.nq, cs.H, cs.nidx, n, we, wh, wl, rel)
		if !(we <= 1 && wh <= 1 && wl <= 1) || !(rel <= math.Ldexp(1, -9)) {
			t.Errorf("nq=%d H=%d %d splits: outside the bounds: exact %g emulated %g lse %g, unsplit %g", cs.nq, cs.H, n, we, wh, wl, rel)
		}
		if cs.H != 128 {
			continue
		}
		for bad, name := range map[int]string{1: "the split's max left in log2 units", 2: "the split's range start ignored"} {
			o3, l3, _ := wg2DecodeTranscribe(t, c, cs.split, bad)
			if we3, wh3, wl3, _ := c.check(o3, l3); we3 <= 1 && wh3 <= 1 && wl3 <= 1 {
				t.Errorf("planted mistake %q passes the bounds (%g, %g, %g)", name, we3, wh3, wl3)
			} else {
				t.Logf("planted mistake %q: |d|/bound exact %.3g, emulated %.3g, lse %.3g", name, we3, wh3, wl3)
			}
		}
	}
}
