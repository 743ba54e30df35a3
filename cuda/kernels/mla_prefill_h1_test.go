package kernels

// mla_prefill_h1 (cu/mla_tc_prefill_h1.cu) on the GPU: against the CPU
// references of mla_prefill_h1_pure_test.go (float64 on the exact inputs,
// and float64 on the inputs rounded as the kernel rounds them; the bounds
// and why are there) on fresh random inputs, and its timing beside
// mla_prefill_tcp at issue 10's prefill shape (TILERT_GPU_TIMING=1).

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/tilert-go/tilert/cuda"
)

func TestKernelMLAPrefillH1(t *testing.T) {
	onGPU(t, func(c *cuda.Ctx, k *Set, a *allocs, r *rand.Rand) {
		if !k.MLAPrefillH1Supported() {
			t.Skip("mla_prefill_h1 needs sm_89+")
		}
		s := c.Stream()
		// 37 causal rows x 72 heads (two head blocks, the second 8 of 64),
		// selections of 0..192 entries at random positions among -1
		// padding (one row none, one row all 192), one entry past each
		// row's length, entries between nidx and ldIdx that must not be
		// read; then tiny-model heads (4) and top-k (32); then 128 heads
		// with 300 entries (5 tiles, the last part-filled) and a paged
		// cache (block table).
		for _, cs := range []struct {
			nq, H, nidx, ldIdx int
			scale              float32
			paged              bool
		}{{37, 72, 192, 200, 0.1, false}, {24, 4, 32, 32, 0.1, false}, {9, 128, 300, 304, 0.06, true}} {
			cc := newH1Case(r, cs.nq, cs.H, cs.nidx, cs.ldIdx, cs.scale)
			cache, bt := cc.devCache(a, cs.paged)
			op, lp := a.poisoned(cs.nq*cs.H*512), a.poisoned(cs.nq*cs.H)
			chk(k.MLAPrefillH1(s, op, lp, a.up(cc.qn), a.up(cc.qp), cache, bt, a.up(cc.idx), a.up(cc.lens), cs.nq, cs.H, cs.nidx, cs.ldIdx, cs.scale))
			got, gotL := downF32(c, op, cs.nq*cs.H*512), downF32(c, lp, cs.nq*cs.H)
			we, wh, wl, rel := cc.check(got, gotL)
			name := fmt.Sprintf("mla_prefill_h1 nq=%d H=%d nidx=%d paged=%v (-1, past len, empty row)", cs.nq, cs.H, cs.nidx, cs.paged)
			t.Logf("%s: max|d|/max|v| vs float64 %.3g", name, rel)
			record(t, name+" vs float64", "max |d|/bound (one fp16 part)", we, 1)
			record(t, name+" vs kernel-rounded inputs", "max |d|/bound (fp16 P, float32)", wh, 1)
			record(t, name+" (lse)", "max |d|/bound", wl, 1)
			// The same launch again: the same bits (no races between tiles).
			op2 := a.poisoned(cs.nq * cs.H * 512)
			chk(k.MLAPrefillH1(s, op2, 0, a.up(cc.qn), a.up(cc.qp), cache, bt, a.up(cc.idx), a.up(cc.lens), cs.nq, cs.H, cs.nidx, cs.ldIdx, cs.scale))
			got2 := downF32(c, op2, cs.nq*cs.H*512)
			record(t, name+" repeated launch", "values differing", float64(diffCount(got, got2)), 0)
		}
		// Bad arguments are refused before any launch.
		for _, bad := range []struct{ nq, H, nidx, ldIdx int }{{0, 128, 64, 64}, {4, 0, 64, 64}, {4, 128, 64, 63}, {70000, 128, 64, 64}} {
			if err := k.MLAPrefillH1(s, a.raw(4), 0, a.raw(4), a.raw(4), a.raw(4), 0, a.raw(4), a.raw(4), bad.nq, bad.H, bad.nidx, bad.ldIdx, 0.1); err == nil {
				t.Errorf("MLAPrefillH1 accepted nq=%d H=%d nidx=%d ldIdx=%d", bad.nq, bad.H, bad.nidx, bad.ldIdx)
			}
		}
	})
}

// Issue 10's prefill shape: 256 rows of a chunk, 128 heads, top-k 2048 of
// an 8192-token cache (8192 rows = 32x this); mla_prefill_tcp (the
// TILERT_GPU_MLA_PREFILL=2 kernel) beside it and a device copy for scale.
// TFLOP/s counts (576 + 512) x 2 flops per head and entry.
func TestKernelTimingMLAPrefillH1(t *testing.T) {
	needTiming(t)
	onGPU(t, func(c *cuda.Ctx, k *Set, a *allocs, r *rand.Rand) {
		if !k.MLAPrefillH1Supported() {
			t.Skip("mla_prefill_h1 needs sm_89+")
		}
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
			if nq == 256 {
				us := medianUs(c, s, 2, 5, func() {
					chk(k.MLAPrefillTCP(s, out, 0, qn, qp, cache, 0, ip, lens, 0, nq, H, nidx, nidx, 1, 0.1))
				})
				add(fmtName("mla_prefill_tcp H=%d topk=2048 nq=%d", H, nq), nb, us, "TILERT_GPU_MLA_PREFILL=2, "+tf(us))
			}
			us := medianUs(c, s, 3, 7, func() {
				chk(k.MLAPrefillH1(s, out, 0, qn, qp, cache, 0, ip, lens, nq, H, nidx, nidx, 0.1))
			})
			add(fmtName("mla_prefill_h1 H=%d topk=2048 nq=%d", H, nq), nb, us, "TILERT_GPU_MLA_PREFILL=4, "+tf(us))
		}
	})
}

// devCache uploads the case's cache: as is, or paged (pages of 64 tokens in
// reverse order, slot = bt[t/64]*64 + t%64) with its block table.
func (cc *h1Case) devCache(a *allocs, paged bool) (cache, bt cuda.DevPtr) {
	if !paged {
		return a.up(cc.cache), 0
	}
	np := cdiv(cc.T, 64)
	img := make([]byte, np*64*MLATokenBytes)
	tbl := make([]int32, np)
	for p := range np {
		tbl[p] = int32(np - 1 - p)
		n := min(64, cc.T-64*p)
		copy(img[int(tbl[p])*64*MLATokenBytes:], cc.cache[64*p*MLATokenBytes:(64*p+n)*MLATokenBytes])
	}
	return a.up(img), a.up(tbl)
}
