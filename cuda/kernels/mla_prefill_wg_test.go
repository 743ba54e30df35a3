package kernels

// mla_prefill_wg (cu/wg/mla_prefill_wg.cu, the sm_90a module) on the GPU:
// against mla_prefill_h1's CPU references and bounds (the same roundings;
// mla_prefill_h1_pure_test.go) on fresh random inputs, against
// mla_prefill_h1 itself on the same inputs, and its timing beside
// mla_prefill_h1 and a device copy at issue 10's prefill shape
// (TILERT_GPU_TIMING=1).

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/tilert-go/tilert/cuda"
)

// needWG skips off compute capability 9.0 and fails on 9.0 when the sm_90a
// module does not load (on an H100/H200 with NVRTC 12+ it must). The checks
// ran on the H200 in session 8 (docs/measured/h200-2026-12-02-s8) and are no
// longer opt-in.
func needWG(t *testing.T, c *cuda.Ctx, k *Set) {
	t.Helper()
	if i := c.Info(); i.CCMajor != 9 || i.CCMinor != 0 {
		t.Skipf("mla_prefill_wg needs compute capability 9.0 (this device is %d.%d)", i.CCMajor, i.CCMinor)
	}
	if err := k.WGSupported(); err != nil {
		t.Fatalf("the sm_90a module does not load on this 9.0 device: %+v", err)
	}
}

func TestKernelMLAPrefillWG(t *testing.T) {
	onGPU(t, func(c *cuda.Ctx, k *Set, a *allocs, r *rand.Rand) {
		needWG(t, c, k)
		s := c.Stream()
		// mla_prefill_h1's cases: 37 causal rows x 72 heads (two head
		// blocks, the second 8 of 64), selections of 0..192 among -1
		// padding, entries past each row's length and between nidx and
		// ldIdx; tiny-model heads (4); 128 heads x 300 entries with a
		// paged cache; and issue 10's top-k 2048 of 8192 with 128 heads.
		for _, cs := range []struct {
			nq, H, nidx, ldIdx int
			scale              float32
			paged              bool
		}{{37, 72, 192, 200, 0.1, false}, {24, 4, 32, 32, 0.1, false}, {9, 128, 300, 304, 0.06, true}, {6, 128, 2048, 2048, 0.07, false}} {
			cc := newH1Case(r, cs.nq, cs.H, cs.nidx, cs.ldIdx, cs.scale)
			cache, bt := cc.devCache(a, cs.paged)
			qn, qp, ip, lp := a.up(cc.qn), a.up(cc.qp), a.up(cc.idx), a.up(cc.lens)
			op, lsp := a.poisoned(cs.nq*cs.H*512), a.poisoned(cs.nq*cs.H)
			chk(k.MLAPrefillWG(s, op, lsp, qn, qp, cache, bt, ip, lp, cs.nq, cs.H, cs.nidx, cs.ldIdx, cs.scale))
			got, gotL := downF32(c, op, cs.nq*cs.H*512), downF32(c, lsp, cs.nq*cs.H)
			we, wh, wl, rel := cc.check(got, gotL)
			name := fmt.Sprintf("mla_prefill_wg nq=%d H=%d nidx=%d paged=%v", cs.nq, cs.H, cs.nidx, cs.paged)
			t.Logf("%s: max|d|/max|v| vs float64 %.3g", name, rel)
			record(t, name+" vs float64", "max |d|/bound (one fp16 part)", we, 1)
			record(t, name+" vs kernel-rounded inputs", "max |d|/bound (fp16 P, float32)", wh, 1)
			record(t, name+" (lse)", "max |d|/bound", wl, 1)
			// mla_prefill_h1 on the same inputs: the same function, float32
			// sums in another order (an fp16 probability may round the
			// other way: 2^-11 of it).
			oh, lh := a.poisoned(cs.nq*cs.H*512), a.poisoned(cs.nq*cs.H)
			chk(k.MLAPrefillH1(s, oh, lh, qn, qp, cache, bt, ip, lp, cs.nq, cs.H, cs.nidx, cs.ldIdx, cs.scale))
			ref, refL := downF32(c, oh, cs.nq*cs.H*512), downF32(c, lh, cs.nq*cs.H)
			var dmax, vmax, lmax float64
			for i := range ref {
				dmax = max(dmax, math.Abs(float64(got[i]-ref[i])))
				vmax = max(vmax, math.Abs(float64(ref[i])))
				if math.IsNaN(float64(got[i])) {
					dmax = math.Inf(1)
				}
			}
			for i := range refL {
				switch {
				case math.IsInf(float64(refL[i]), -1) != math.IsInf(float64(gotL[i]), -1) || math.IsNaN(float64(gotL[i])):
					lmax = math.Inf(1)
				case !math.IsInf(float64(refL[i]), -1):
					lmax = max(lmax, math.Abs(float64(gotL[i]-refL[i]))/(1+math.Abs(float64(refL[i]))))
				}
			}
			record(t, name+" vs mla_prefill_h1", "max |d|/max|v|", dmax/max(vmax, 1e-30), math.Ldexp(1, -10))
			record(t, name+" vs mla_prefill_h1 (lse)", "max |d|/(1+|lse|)", lmax, math.Ldexp(1, -16))
			// The same launch again: the same bits (no races between tiles).
			op2 := a.poisoned(cs.nq * cs.H * 512)
			chk(k.MLAPrefillWG(s, op2, 0, qn, qp, cache, bt, ip, lp, cs.nq, cs.H, cs.nidx, cs.ldIdx, cs.scale))
			got2 := downF32(c, op2, cs.nq*cs.H*512)
			record(t, name+" repeated launch", "values differing", float64(diffCount(got, got2)), 0)
		}
		for _, bad := range []struct{ nq, H, nidx, ldIdx int }{{0, 128, 64, 64}, {4, 0, 64, 64}, {4, 128, 64, 63}, {70000, 128, 64, 64}} {
			if err := k.MLAPrefillWG(s, a.raw(4), 0, a.raw(4), a.raw(4), a.raw(4), 0, a.raw(4), a.raw(4), bad.nq, bad.H, bad.nidx, bad.ldIdx, 0.1); err == nil {
				t.Errorf("MLAPrefillWG accepted nq=%d H=%d nidx=%d ldIdx=%d", bad.nq, bad.H, bad.nidx, bad.ldIdx)
			}
		}
	})
}

// Issue 10's prefill shape (TestKernelTimingMLAPrefillH1's): 128 heads,
// top-k 2048 of an 8192-token cache, 256 and 1024 rows; mla_prefill_h1
// and mla_prefill_wg2 (TILERT_GPU_MLA_PREFILL=6) beside it and a device
// copy for scale.
func TestKernelTimingMLAPrefillWG(t *testing.T) {
	needTiming(t)
	onGPU(t, func(c *cuda.Ctx, k *Set, a *allocs, r *rand.Rand) {
		needWG(t, c, k)
		s := c.Stream()
		add := timingTable(t, c, a, r, 256<<20, "device-to-device copy 256 MiB (read+write)", "reference of this table")
		const H, nidx, T = 128, 2048, 8192
		cache := devMLACache(c, a, r, T)
		for _, nq := range []int{256, 1024} {
			qn, qp, ip, lens, out := devMLAQueries(a, r, nq, H, nidx, T)
			nb := float64(nq * (nidx*MLATokenBytes + 4*H*(512+64+512)))
			flop := float64(nq) * H * nidx * (576 + 512) * 2
			tf := func(us float64) string {
				return fmt.Sprintf("%.0f TFLOP/s; 8192 rows ~%.1f ms", flop/us/1e6, us*8192/float64(nq)/1e3)
			}
			us := medianUs(c, s, 3, 7, func() {
				chk(k.MLAPrefillH1(s, out, 0, qn, qp, cache, 0, ip, lens, nq, H, nidx, nidx, 0.1))
			})
			add(fmtName("mla_prefill_h1 H=%d topk=2048 nq=%d", H, nq), nb, us, "TILERT_GPU_MLA_PREFILL=4, "+tf(us))
			us = medianUs(c, s, 3, 7, func() {
				chk(k.MLAPrefillWG(s, out, 0, qn, qp, cache, 0, ip, lens, nq, H, nidx, nidx, 0.1))
			})
			add(fmtName("mla_prefill_wg H=%d topk=2048 nq=%d", H, nq), nb, us, "TILERT_GPU_MLA_PREFILL=5, "+tf(us))
			us = medianUs(c, s, 3, 7, func() {
				chk(k.MLAPrefillWG2(s, out, 0, qn, qp, cache, 0, ip, lens, nq, H, nidx, nidx, 0.1))
			})
			add(fmtName("mla_prefill_wg2 H=%d topk=2048 nq=%d", H, nq), nb, us, "TILERT_GPU_MLA_PREFILL=6, "+tf(us))
		}
	})
}

// The kernel's two wgmma uses on the hardware, alone (mwg_probe): the
// N-major B of P.V and the K-major A/B of QK^T with the kernel's
// descriptors and MWG_OFF layout, on small-integer fp16 inputs (exact
// float32 sums, so any wrong element shows). Mode 1 (the N-major B's LBO
// and SBO swapped) is logged only: if the kernel's convention failed, it
// says whether the other reading is the hardware's.
func TestKernelWGMMAProbe(t *testing.T) {
	onGPU(t, func(c *cuda.Ctx, k *Set, a *allocs, r *rand.Rand) {
		needWG(t, c, k)
		mod, err := k.wg()
		chk(err)
		f, err := k.c.Function(mod, "mwg_probe")
		chk(err)
		const smem = 8*8*128 + 64*8*128 // a: 64 x 64, b: 64 x 512 halves (MWG_OFF)
		chk(k.c.SetMaxDynamicShared(f, smem))
		av, bv := make([]float64, 64*64), make([]float64, 64*512)
		ah, bh := make([]uint16, len(av)), make([]uint16, len(bv))
		for i := range av {
			av[i] = float64(r.IntN(9)-4) / 4
			ah[i] = h1Bits(av[i])
		}
		for i := range bv {
			bv[i] = float64(r.IntN(9)-4) / 4
			bh[i] = h1Bits(bv[i])
		}
		ap, bp := a.up(ah), a.up(bh)
		s := c.Stream()
		for mode := range 3 {
			dp := a.poisoned(64 * 512)
			chk(k.launchFn(f, cuda.D1(1), cuda.D1(256), smem, s, ap, bp, dp, mode))
			chk(c.SyncStream(s))
			got := downF32(c, dp, 64*512)
			wrong := 0
			for h := range 64 {
				cols := 512
				if mode == 2 {
					cols = 64
				}
				for n := range cols {
					var want float64
					for kk := range 64 {
						if mode == 2 {
							want += av[h*64+kk] * bv[n*512+kk]
						} else {
							want += av[h*64+kk] * bv[kk*512+n]
						}
					}
					if float64(got[h*512+n]) != want {
						wrong++
					}
				}
			}
			name := [3]string{"wgmma probe P.V (m64n256k16, B N-major, LBO 128 SBO 1024: the kernel's)",
				"wgmma probe P.V with B's LBO/SBO swapped (not the kernel's)",
				"wgmma probe QK^T (m64n32k16, A and B K-major, LBO 1024 SBO 128: the kernel's)"}[mode]
			if mode == 1 {
				t.Logf("%s: %d of %d values wrong", name, wrong, 64*512)
				continue
			}
			record(t, name, "values wrong (exact sums)", float64(wrong), 0)
		}
	})
}
