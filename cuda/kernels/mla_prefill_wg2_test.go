package kernels

// mla_prefill_wg2 (cu/wg/mla_prefill_wg2.cu, the sm_90a module) on the GPU:
// mla_prefill_wg's checks (h1's references and bounds on fresh random
// inputs), plus bit for bit against mla_prefill_wg (its consumers are wg's
// code on the same fp16 tiles: any differing value is a bug in the
// producer or the handoff) and against mla_prefill_h1 (the same bits
// measured for wg in session 8; bound wg's 2^-10), rows whose valid tiles
// are separated by empty ones (the producer's skip), repeated launches and
// bad arguments; its timing is in TestKernelTimingMLAPrefillWG.

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/tilert-go/tilert/cuda"
)

func TestKernelMLAPrefillWG2(t *testing.T) {
	onGPU(t, func(c *cuda.Ctx, k *Set, a *allocs, r *rand.Rand) {
		needWG(t, c, k)
		s := c.Stream()
		// mla_prefill_wg's four cases, and 16 rows x 128 heads over 512
		// entries where the odd rows' tiles 1 and 2 hold no valid entry
		// (the producer hands off tiles 0 and 3 only: stages 0, 1).
		for _, cs := range []struct {
			nq, H, nidx, ldIdx int
			scale              float32
			paged, holes       bool
		}{{37, 72, 192, 200, 0.1, false, false}, {24, 4, 32, 32, 0.1, false, false}, {9, 128, 300, 304, 0.06, true, false},
			{6, 128, 2048, 2048, 0.07, false, false}, {16, 128, 512, 512, 0.08, false, true}} {
			cc := newH1Case(r, cs.nq, cs.H, cs.nidx, cs.ldIdx, cs.scale)
			if cs.holes {
				for qi := 1; qi < cs.nq; qi += 2 {
					for j := 64; j < 192; j++ {
						cc.idx[qi*cs.ldIdx+j] = -1
					}
					for j := 192; j < 256; j++ {
						cc.idx[qi*cs.ldIdx+j] = int32(r.IntN(int(cc.lens[qi])))
					}
				}
			}
			cache, bt := cc.devCache(a, cs.paged)
			qn, qp, ip, lp := a.up(cc.qn), a.up(cc.qp), a.up(cc.idx), a.up(cc.lens)
			op, lsp := a.poisoned(cs.nq*cs.H*512), a.poisoned(cs.nq*cs.H)
			chk(k.MLAPrefillWG2(s, op, lsp, qn, qp, cache, bt, ip, lp, cs.nq, cs.H, cs.nidx, cs.ldIdx, cs.scale))
			got, gotL := downF32(c, op, cs.nq*cs.H*512), downF32(c, lsp, cs.nq*cs.H)
			we, wh, wl, rel := cc.check(got, gotL)
			name := fmt.Sprintf("mla_prefill_wg2 nq=%d H=%d nidx=%d paged=%v holes=%v", cs.nq, cs.H, cs.nidx, cs.paged, cs.holes)
			t.Logf("%s: max|d|/max|v| vs float64 %.3g", name, rel)
			record(t, name+" vs float64", "max |d|/bound (one fp16 part)", we, 1)
			record(t, name+" vs kernel-rounded inputs", "max |d|/bound (fp16 P, float32)", wh, 1)
			record(t, name+" (lse)", "max |d|/bound", wl, 1)
			// mla_prefill_wg on the same inputs: the same bits.
			ow, lw := a.poisoned(cs.nq*cs.H*512), a.poisoned(cs.nq*cs.H)
			chk(k.MLAPrefillWG(s, ow, lw, qn, qp, cache, bt, ip, lp, cs.nq, cs.H, cs.nidx, cs.ldIdx, cs.scale))
			refW, refWL := downF32(c, ow, cs.nq*cs.H*512), downF32(c, lw, cs.nq*cs.H)
			record(t, name+" vs mla_prefill_wg", "values differing (bits)", float64(bitDiff(got, refW)+bitDiff(gotL, refWL)), 0)
			// mla_prefill_h1: the same function (wg gave its bits on the
			// H200); bound as wg's check, and the count logged.
			oh, lh := a.poisoned(cs.nq*cs.H*512), a.poisoned(cs.nq*cs.H)
			chk(k.MLAPrefillH1(s, oh, lh, qn, qp, cache, bt, ip, lp, cs.nq, cs.H, cs.nidx, cs.ldIdx, cs.scale))
			ref, refL := downF32(c, oh, cs.nq*cs.H*512), downF32(c, lh, cs.nq*cs.H)
			var dmax, vmax float64
			for i := range ref {
				dmax = max(dmax, math.Abs(float64(got[i]-ref[i])))
				vmax = max(vmax, math.Abs(float64(ref[i])))
				if math.IsNaN(float64(got[i])) {
					dmax = math.Inf(1)
				}
			}
			t.Logf("%s: %d output and %d lse values differ from mla_prefill_h1 in bits", name, bitDiff(got, ref), bitDiff(gotL, refL))
			record(t, name+" vs mla_prefill_h1", "max |d|/max|v|", dmax/max(vmax, 1e-30), math.Ldexp(1, -10))
			// The same launch again: the same bits (no races between the
			// producer and the consumers, or between tiles).
			for rep := range 3 {
				op2 := a.poisoned(cs.nq * cs.H * 512)
				chk(k.MLAPrefillWG2(s, op2, 0, qn, qp, cache, bt, ip, lp, cs.nq, cs.H, cs.nidx, cs.ldIdx, cs.scale))
				got2 := downF32(c, op2, cs.nq*cs.H*512)
				if n := bitDiff(got, got2); n != 0 || rep == 2 {
					record(t, name+" repeated launch", "values differing (bits)", float64(n), 0)
					break
				}
			}
		}
		for _, bad := range []struct{ nq, H, nidx, ldIdx int }{{0, 128, 64, 64}, {4, 0, 64, 64}, {4, 128, 64, 63}, {70000, 128, 64, 64}} {
			if err := k.MLAPrefillWG2(s, a.raw(4), 0, a.raw(4), a.raw(4), a.raw(4), 0, a.raw(4), a.raw(4), bad.nq, bad.H, bad.nidx, bad.ldIdx, 0.1); err == nil {
				t.Errorf("MLAPrefillWG2 accepted nq=%d H=%d nidx=%d ldIdx=%d", bad.nq, bad.H, bad.nidx, bad.ldIdx)
			}
		}
		if err := k.MLAPrefillWG2(s, 0, 0, a.raw(4), a.raw(4), a.raw(4), 0, a.raw(4), a.raw(4), 4, 128, 64, 64, 0.1); err == nil {
			t.Error("MLAPrefillWG2 accepted a nil output")
		}
	})
}

// bitDiff counts the values of a and b whose bits differ (NaN payloads
// included).
func bitDiff(a, b []float32) int {
	n := 0
	for i := range a {
		if math.Float32bits(a[i]) != math.Float32bits(b[i]) {
			n++
		}
	}
	return n
}
