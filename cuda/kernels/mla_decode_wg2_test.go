package kernels

// mla_decode_wg2 (cu/wg/mla_prefill_wg2.cu, the sm_90a module) on the GPU:
// the decode step's sparse MLA on mla_prefill_wg2's block with the
// selections split over the SMs. Against float64 within the one-fp16-part
// bounds of mla_prefill_h1's checks (fresh random inputs), bit for bit
// against mla_prefill_wg2 unsplit (the same block), near it split (only
// the partials' merge differs), per-row cache bases against the same rows
// launched alone, repeated launches and bad arguments. Timing beside
// mla_decode_tcf2: TestKernelTimingMLADecodeWG2.

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/tilert-go/tilert/cuda"
)

// wg2Name is the kernel MLADecodeWG2 launches for nq rows of H heads and
// nidx selections in nsplit ranges.
func wg2Name(nq, H, nidx, nsplit int) string {
	name, _ := wg2Kernel(nq, H, cdiv(cdiv(nidx, max(1, nsplit)), mlaPrefillH1Tile)*mlaPrefillH1Tile)
	return name
}

// withHeadsPerBlock runs f with MLAHeadsPerBlock set to hpb.
func withHeadsPerBlock(hpb int, f func()) {
	old := MLAHeadsPerBlock
	MLAHeadsPerBlock = hpb
	defer func() { MLAHeadsPerBlock = old }()
	f()
}

// withWG2B runs f with MLAWG2B set to on.
func withWG2B(on bool, f func()) {
	old := MLAWG2B
	MLAWG2B = on
	defer func() { MLAWG2B = old }()
	f()
}

func TestKernelMLADecodeWG2(t *testing.T) {
	onGPU(t, func(c *cuda.Ctx, k *Set, a *allocs, r *rand.Rand) {
		needWG(t, c, k)
		s := c.Stream()
		for _, cs := range []struct {
			nq, H, nidx, ldIdx int
			scale              float32
			paged              bool
			split              int // 0: MLAWG2Splits
		}{{1, 128, 2048, 2048, 0.07, false, 0}, {1, 64, 2048, 2048, 0.07, false, 0}, {4, 128, 2048, 2048, 0.07, false, 0}, {4, 128, 2048, 2048, 0.07, false, 3},
			{3, 72, 192, 200, 0.1, false, 0}, {2, 128, 300, 304, 0.06, true, 0}, {5, 64, 512, 512, 0.08, false, 1}} {
			cc := newH1Case(r, cs.nq, cs.H, cs.nidx, cs.ldIdx, cs.scale)
			cache, bt := cc.devCache(a, cs.paged)
			ns := cs.split
			if ns == 0 {
				ns = k.MLAWG2Splits(cs.nq, cs.H, cs.nidx)
			}
			ws := a.raw(MLAWorkspaceBytes(cs.nq, cs.H, ns) + 4)
			qn, qp, ip, lp := a.up(cc.qn), a.up(cc.qp), a.up(cc.idx), a.up(cc.lens)
			n := cs.nq * cs.H
			op, lsp := a.poisoned(n*512), a.poisoned(n)
			name := fmt.Sprintf("%s nq=%d H=%d nidx=%d paged=%v split=%d", wg2Name(cs.nq, cs.H, cs.nidx, ns), cs.nq, cs.H, cs.nidx, cs.paged, ns)
			chk(k.MLADecodeWG2(s, op, lsp, qn, qp, cache, bt, 0, ip, lp, ws, cs.nq, cs.H, cs.nidx, cs.ldIdx, ns, cs.scale))
			got, gotL := downF32(c, op, n*512), downF32(c, lsp, n)
			// mla_decode_wg2b against mla_decode_wg2: the same arithmetic,
			// so the same bits (the one-tile gather, the query rounds and
			// the staged partial rows change only when values move).
			if wg2Name(cs.nq, cs.H, cs.nidx, ns) == mlaDecodeWG2BName {
				o0, l0 := a.poisoned(n*512), a.poisoned(n)
				withWG2B(false, func() {
					chk(k.MLADecodeWG2(s, o0, l0, qn, qp, cache, bt, 0, ip, lp, ws, cs.nq, cs.H, cs.nidx, cs.ldIdx, ns, cs.scale))
				})
				record(t, name+" vs mla_decode_wg2", "values differing (bits)", float64(bitDiff(got, downF32(c, o0, n*512))+bitDiff(gotL, downF32(c, l0, n))), 0)
			}
			we, wh, wl, rel := cc.check(got, gotL)
			t.Logf("%s: max|d|/max|v| vs float64 %.3g", name, rel)
			record(t, name+" vs float64", "max |d|/bound (one fp16 part)", we, 1)
			record(t, name+" vs kernel-rounded inputs", "max |d|/bound (fp16 P, float32)", wh, 1)
			record(t, name+" (lse)", "max |d|/bound", wl, 1)
			// mla_prefill_wg2 (one block a row and head block, unsplit).
			ow, lw := a.poisoned(n*512), a.poisoned(n)
			chk(k.MLAPrefillWG2(s, ow, lw, qn, qp, cache, bt, ip, lp, cs.nq, cs.H, cs.nidx, cs.ldIdx, cs.scale))
			ref, refL := downF32(c, ow, n*512), downF32(c, lw, n)
			if ns == 1 {
				record(t, name+" vs mla_prefill_wg2", "values differing (bits)", float64(bitDiff(got, ref)+bitDiff(gotL, refL)), 0)
			} else {
				var dmax, vmax float64
				for i := range ref {
					dmax = max(dmax, math.Abs(float64(got[i]-ref[i])))
					vmax = max(vmax, math.Abs(float64(ref[i])))
					if math.IsNaN(float64(got[i])) {
						dmax = math.Inf(1)
					}
				}
				record(t, name+" vs mla_prefill_wg2", "max |d|/max|v|", dmax/max(vmax, 1e-30), math.Ldexp(1, -9))
			}
			for rep := range 3 {
				op2 := a.poisoned(n * 512)
				chk(k.MLADecodeWG2(s, op2, 0, qn, qp, cache, bt, 0, ip, lp, ws, cs.nq, cs.H, cs.nidx, cs.ldIdx, ns, cs.scale))
				if d := bitDiff(got, downF32(c, op2, n*512)); d != 0 || rep == 2 {
					record(t, name+" repeated launch", "values differing (bits)", float64(d), 0)
					break
				}
			}
		}
		// Rows of several slots: each row's cache in its own region, found
		// through the row-base table (region - off) plus the launch's cache
		// argument off (the layer's offset in the engine), against each row
		// launched alone on its own region, the same splits: the same bits.
		{
			const nq, H, nidx, ns = 3, 128, 512, 4
			cc := newH1Case(r, nq, H, nidx, nidx, 0.08)
			const off = 1024
			regions := make([]cuda.DevPtr, nq)
			for q := range nq {
				regions[q] = a.raw(int64(len(cc.cache)))
				chk(c.Upload(regions[q], cc.cache))
			}
			rb := rowBases(a, regions, off)
			qn, qp, ip, lp := a.up(cc.qn), a.up(cc.qp), a.up(cc.idx), a.up(cc.lens)
			ws := a.raw(MLAWorkspaceBytes(nq, H, ns))
			op := a.poisoned(nq * H * 512)
			chk(k.MLADecodeWG2(s, op, 0, qn, qp, cuda.DevPtr(off), 0, rb, ip, lp, ws, nq, H, nidx, nidx, ns, cc.scale))
			got := downF32(c, op, nq*H*512)
			diff := 0
			for q := range nq {
				o1 := a.poisoned(H * 512)
				ws1 := a.raw(MLAWorkspaceBytes(1, H, ns))
				chk(k.MLADecodeWG2(s, o1, 0, qn.Add(int64(4*q*H*512)), qp.Add(int64(4*q*H*64)), regions[q], 0, 0,
					ip.Add(int64(4*q*nidx)), lp.Add(int64(4*q)), ws1, 1, H, nidx, nidx, ns, cc.scale))
				diff += bitDiff(got[q*H*512:(q+1)*H*512], downF32(c, o1, H*512))
			}
			record(t, "mla_decode_wg2 row bases vs rows alone", "values differing (bits)", float64(diff), 0)
			we, _, _, _ := cc.check(got, nil)
			record(t, "mla_decode_wg2 row bases vs float64", "max |d|/bound (one fp16 part)", we, 1)
		}
		for _, bad := range []struct{ nq, H, nidx, ldIdx, ns int }{{0, 128, 64, 64, 1}, {4, 0, 64, 64, 1}, {4, 128, 64, 63, 1}, {4, 128, 64, 64, 300}, {70000, 128, 64, 64, 1}} {
			if err := k.MLADecodeWG2(s, a.raw(4), 0, a.raw(4), a.raw(4), a.raw(4), 0, 0, a.raw(4), a.raw(4), a.raw(4), bad.nq, bad.H, bad.nidx, bad.ldIdx, bad.ns, 0.1); err == nil {
				t.Errorf("MLADecodeWG2 accepted nq=%d H=%d nidx=%d ldIdx=%d nsplit=%d", bad.nq, bad.H, bad.nidx, bad.ldIdx, bad.ns)
			}
		}
		if err := k.MLADecodeWG2(s, a.raw(4), 0, a.raw(4), a.raw(4), a.raw(4), 0, 0, a.raw(4), a.raw(4), 0, 1, 128, 2048, 2048, 4, 0.1); err == nil {
			t.Error("MLADecodeWG2 accepted 4 splits without a workspace")
		}
	})
}

// TestKernelMLADecodeWG2H: with MLAHeadsPerBlock 32 (mla_decode_wg2h) the
// outputs and lse are mla_decode_wg2b's bit for bit (each head's
// arithmetic is its own product row's) on fresh random inputs: one row of
// 128 heads (DeepSeek-V3.2), one and two of 64 (GLM-5), 48 heads (a last
// block of 16), 96 (three blocks) and rows through per-row cache bases; a repeated launch equal; within the
// one-fp16-part bound of float64. It fails unless the rule names the kernel,
// the launch counter saw it run, and the comparison ran wg2b.
func TestKernelMLADecodeWG2H(t *testing.T) {
	onGPU(t, func(c *cuda.Ctx, k *Set, a *allocs, r *rand.Rand) {
		needWG(t, c, k)
		s := c.Stream()
		const nidx = 2048
		for _, cs := range []struct {
			hpb   int
			nq, H int
			bases bool
		}{{32, 1, 128, false}, {32, 1, 64, false}, {32, 2, 64, false}, {32, 1, 48, false}, {32, 1, 96, false}, {32, 2, 64, true}} {
			cc := newH1Case(r, cs.nq, cs.H, nidx, nidx, 0.07)
			ns := k.MLAWG2Splits(cs.nq, cs.H, nidx)
			var half, plain string
			withHeadsPerBlock(cs.hpb, func() { half = wg2Name(cs.nq, cs.H, nidx, ns) })
			withHeadsPerBlock(64, func() { plain = wg2Name(cs.nq, cs.H, nidx, ns) })
			want := mlaDecodeWG2HName
			name := fmt.Sprintf("%s nq=%d H=%d nidx=%d split=%d bases=%v", want, cs.nq, cs.H, nidx, ns, cs.bases)
			if half != want || plain != mlaDecodeWG2BName {
				t.Fatalf("%s: launches %s with MLAHeadsPerBlock %d and %s without, want %s and %s", name, half, cs.hpb, plain, want, mlaDecodeWG2BName)
			}
			var cache, rb cuda.DevPtr
			if cs.bases {
				const off = 1024
				regions := make([]cuda.DevPtr, cs.nq)
				for q := range cs.nq {
					regions[q] = a.raw(int64(len(cc.cache)))
					chk(c.Upload(regions[q], cc.cache))
				}
				cache, rb = cuda.DevPtr(off), rowBases(a, regions, off)
			} else {
				cache, _ = cc.devCache(a, false)
			}
			ws := a.raw(MLAWorkspaceBytes(cs.nq, cs.H, ns) + 4)
			qn, qp, ip, lp := a.up(cc.qn), a.up(cc.qp), a.up(cc.idx), a.up(cc.lens)
			n := cs.nq * cs.H
			run := func(on bool) ([]float32, []float32) {
				op, lsp := a.poisoned(n*512), a.poisoned(n)
				hpb := 64 // mla_decode_wg2b
				if on {
					hpb = cs.hpb
				}
				withHeadsPerBlock(hpb, func() {
					chk(k.MLADecodeWG2(s, op, lsp, qn, qp, cache, 0, rb, ip, lp, ws, cs.nq, cs.H, nidx, nidx, ns, cc.scale))
				})
				return downF32(c, op, n*512), downF32(c, lsp, n)
			}
			n0 := MLAWG2HLaunches.Load()
			got, gotL := run(true)
			if MLAWG2HLaunches.Load() == n0 {
				t.Fatalf("%s: MLADecodeWG2 did not launch %s", name, want)
			}
			ref, refL := run(false)
			record(t, name+" vs mla_decode_wg2b", "values differing (bits)", float64(bitDiff(got, ref)+bitDiff(gotL, refL)), 0)
			again, againL := run(true)
			record(t, name+" repeated", "values differing (bits)", float64(bitDiff(got, again)+bitDiff(gotL, againL)), 0)
			we, wh, wl, _ := cc.check(got, gotL)
			record(t, name+" vs float64", "max |d|/bound (one fp16 part)", we, 1)
			record(t, name+" vs kernel-rounded inputs", "max |d|/bound (fp16 P, float32)", wh, 1)
			record(t, name+" (lse)", "max |d|/bound", wl, 1)
		}
	})
}

// TestKernelTimingMLADecodeWG2: graph-timed, the cache (131072 entries, 86
// MB) larger than the L2 and 8 query sets rotating, 1 and 4 rows of 128 and
// 64 heads (DeepSeek-V3.2, GLM-5) x 2048 selections: mla_decode_tcf2
// + combine (the default before session 19) at its planned split against mla_decode_wg2 +
// combine at MLAWG2Splits and at half and twice that.
func TestKernelTimingMLADecodeWG2(t *testing.T) {
	needTiming(t)
	onGPU(t, func(c *cuda.Ctx, k *Set, a *allocs, r *rand.Rand) {
		needWG(t, c, k)
		s := c.Stream()
		add := timingTable(t, c, a, r, 256<<20, "device-to-device copy 256 MiB (read+write)", "reference of this table")
		const nidx, T, sets = 2048, 131072, 8
		cache := devMLACache(c, a, r, T)
		for _, sh := range []struct{ nq, H int }{{1, 128}, {4, 128}, {1, 64}, {4, 64}, {2, 128}} {
			nq, H := sh.nq, sh.H
			var qn, qp, lens, out, ip [sets]cuda.DevPtr
			for i := range sets {
				qn[i], qp[i], ip[i], lens[i], out[i] = devMLAQueries(a, r, nq, H, nidx, T)
			}
			ws := a.raw(max(MLAHeadsWorkspaceBytes(nq, H), MLAWorkspaceBytes(nq, H, 2*mlaWG2MaxSplits)))
			nb := float64(nq * (nidx*MLATokenBytes + 4*H*(512+64+512)))
			ns := k.MLATCSplits(nq, H, nidx)
			us := graphUsRot(c, s, 8, 15, func(i int) {
				chk(k.MLADecodeTCF(s, MLATCF2, out[i], 0, qn[i], qp[i], cache, 0, 0, ip[i], lens[i], ws, nq, H, nidx, nidx, ns, 0.1))
			})
			add(fmtName("graph: mla_decode_tcf2 nq=%d H=%d split=%d", nq, H, ns), nb, us, "decode + combine (tcf2)")
			w := k.MLAWG2Splits(nq, H, nidx)
			withWG2B(false, func() {
				us := graphUsRot(c, s, 8, 15, func(i int) {
					chk(k.MLADecodeWG2(s, out[i], 0, qn[i], qp[i], cache, 0, 0, ip[i], lens[i], ws, nq, H, nidx, nidx, w, 0.1))
				})
				add(fmtName("graph: mla_decode_wg2 nq=%d H=%d split=%d", nq, H, w), nb, us, "decode + combine (session 19's mla_decode_wg2)")
			})
			for _, sp := range []int{w, max(1, w/2), 2 * w} {
				us := graphUsRot(c, s, 8, 15, func(i int) {
					chk(k.MLADecodeWG2(s, out[i], 0, qn[i], qp[i], cache, 0, 0, ip[i], lens[i], ws, nq, H, nidx, nidx, sp, 0.1))
				})
				add(fmtName("graph: %s nq=%d H=%d split=%d", wg2Name(nq, H, nidx, sp), nq, H, sp), nb, us, "decode + combine (MLADecodeWG2's default)")
			}
			withHeadsPerBlock(32, func() {
				kn := wg2Name(nq, H, nidx, w)
				if kn != mlaDecodeWG2HName {
					return
				}
				us := graphUsRot(c, s, 8, 15, func(i int) {
					chk(k.MLADecodeWG2(s, out[i], 0, qn[i], qp[i], cache, 0, 0, ip[i], lens[i], ws, nq, H, nidx, nidx, w, 0.1))
				})
				add(fmtName("graph: %s nq=%d H=%d split=%d", kn, nq, H, w), nb, us, "decode + combine (MLAHeadsPerBlock 32)")
			})
		}
	})
}
