package kernels

// mla_prefill_tc (cu/mla_tc_prefill.cu) against a float64 reference on
// fresh random inputs, at the shape it exists for: many rows of one slot,
// each with its own selection and length, and its timing beside
// mla_decode_tc over the same rows (TILERT_GPU_TIMING=1).

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/tilert-go/tilert/cuda"
)

func TestKernelMLAPrefill(t *testing.T) {
	onGPU(t, func(c *cuda.Ctx, k *Set, a *allocs, r *rand.Rand) {
		s := c.Stream()
		// 37 rows of a causal chunk (row i's length 200 + 3i), H = 40 heads
		// (the last block of 32 half empty), selections of up to 160 of the
		// row's tokens padded with -1, plus one entry at or past the row's
		// length that must be skipped; row 5 selects nothing.
		const nq, H, nidx, ldIdx, scale = 37, 40, 192, 200, 0.3
		T := 200 + 3*nq + 8
		cache := randMLACache(r, T)
		lens := make([]int32, nq)
		idx := make([]int32, nq*ldIdx)
		toks := make([][]int, nq)
		for qi := range nq {
			lens[qi] = int32(200 + 3*qi)
			for j := range ldIdx {
				idx[qi*ldIdx+j] = -1
			}
			if qi == 5 {
				continue
			}
			perm := r.Perm(int(lens[qi]))[:160]
			for j, v := range perm {
				idx[qi*ldIdx+j] = int32(v)
				toks[qi] = append(toks[qi], v)
			}
			idx[qi*ldIdx+170] = lens[qi] + int32(r.IntN(8)) // past the row: skipped
		}
		qn := randF32(r, nq*H*MLALatentDim, 1)
		qp := randF32(r, nq*H*MLARopeDim, 1)
		entry := func(tk int) ([]float64, []float64) {
			row := cache[tk*MLATokenBytes:]
			cv := make([]float64, 512)
			for d := range 512 {
				cv[d] = fp8Table[row[d]] * float64(getF32(row[512+4*(d/128):]))
			}
			rv := make([]float64, 64)
			for i := range 64 {
				rv[i] = bf16ToF64(uint16(row[528+2*i]) | uint16(row[529+2*i])<<8)
			}
			return cv, rv
		}
		cvs, rvs := make([][]float64, T), make([][]float64, T)
		var maxC float64
		for tk := range T {
			cvs[tk], rvs[tk] = entry(tk)
			for _, v := range cvs[tk] {
				maxC = math.Max(maxC, math.Abs(v))
			}
		}
		outs := map[string][]float32{} // nsplit 1's output per kernel
		type launch func(s cuda.Stream, out, lse, qn, qp, cache, blockTable, indices, lens, ws cuda.DevPtr, nq, H, nidx, ldIdx, nsplit int, scale float32) error
		for _, kc := range []struct {
			name string
			f    launch
		}{{"mla_prefill_tc", k.MLAPrefillTC}, {"mla_prefill_tcp", k.MLAPrefillTCP}, {"mla_prefill_tcpi", k.MLAPrefillTCPI}} {
			for _, nsplit := range []int{1, 3} {
				op, lp := a.poisoned(nq*H*512), a.poisoned(nq*H)
				ws := cuda.DevPtr(0)
				if nsplit > 1 {
					ws = a.poisoned(int(MLAWorkspaceBytes(nq, H, nsplit) / 4))
				}
				chk(kc.f(s, op, lp, a.up(qn), a.up(qp), a.up(cache), 0, a.up(idx), a.up(lens), ws, nq, H, nidx, ldIdx, nsplit, scale))
				got, gotL := downF32(c, op, nq*H*512), downF32(c, lp, nq*H)
				if nsplit == 1 {
					outs[kc.name] = got
				}
				var worst, worstL float64
				for qi := range nq {
					for h := range H {
						o := make([]float64, 512)
						lse := math.Inf(-1)
						if tl := toks[qi]; len(tl) > 0 {
							sc := make([]float64, len(tl))
							mx := math.Inf(-1)
							for j, tk := range tl {
								var d float64
								for i := range 512 {
									d += float64(qn[(qi*H+h)*512+i]) * cvs[tk][i]
								}
								for i := range 64 {
									d += float64(qp[(qi*H+h)*64+i]) * rvs[tk][i]
								}
								sc[j] = d * scale
								mx = math.Max(mx, sc[j])
							}
							var l float64
							for j, tk := range tl {
								p := math.Exp(sc[j] - mx)
								l += p
								for i := range 512 {
									o[i] += p * cvs[tk][i]
								}
							}
							for i := range o {
								o[i] /= l
							}
							lse = mx + math.Log(l)
						}
						for i := range 512 {
							g := float64(got[(qi*H+h)*512+i])
							if math.IsNaN(g) {
								worst = math.Inf(1)
							}
							worst = math.Max(worst, math.Abs(g-o[i])/maxC)
						}
						gl := float64(gotL[qi*H+h])
						switch {
						case math.IsInf(lse, -1):
							if !math.IsInf(gl, -1) {
								worstL = math.Inf(1) // an empty row's lse is -inf
							}
						case math.IsNaN(gl):
							worstL = math.Inf(1)
						default:
							worstL = math.Max(worstL, math.Abs(gl-lse)/math.Max(1, math.Abs(lse)))
						}
					}
				}
				name := fmt.Sprintf("%s nq=37 H=40 top-k idx (-1, past len, empty row) split=%d", kc.name, nsplit)
				record(t, name, "max|d|/max|c|", worst, boundTC)
				record(t, name+" (lse)", "|d|/max(1,|lse|)", worstL, boundTC)
			}
		}
		// The integer conversion gives the same bf16 values: the same bits.
		diff := 0
		for i, v := range outs["mla_prefill_tcp"] {
			if math.Float32bits(v) != math.Float32bits(outs["mla_prefill_tcpi"][i]) {
				diff++
			}
		}
		record(t, "mla_prefill_tcpi vs mla_prefill_tcp nq=37 H=40 split=1", "values differing", float64(diff), 0)
		// Bad arguments are refused before any launch.
		for _, bad := range []struct{ nq, H, nidx, ldIdx, nsplit int }{
			{0, H, nidx, ldIdx, 1}, {nq, 0, nidx, ldIdx, 1}, {nq, H, nidx, nidx - 1, 1}, {nq, H, nidx, ldIdx, 2},
		} {
			if err := k.MLAPrefillTC(s, a.raw(4), 0, a.raw(4), a.raw(4), a.raw(4), 0, a.raw(4), a.raw(4), 0, bad.nq, bad.H, bad.nidx, bad.ldIdx, bad.nsplit, scale); err == nil {
				t.Errorf("MLAPrefillTC accepted nq=%d H=%d nidx=%d ldIdx=%d nsplit=%d without a workspace", bad.nq, bad.H, bad.nidx, bad.ldIdx, bad.nsplit)
			}
		}
	})
}

// The prefill shape of issue 10: 256 rows of a chunk, 128 heads, top-k
// 2048 of an 8192-token cache; mla_decode_tc over the same rows (what the
// engine runs by default) beside it.
func TestKernelTimingMLAPrefill(t *testing.T) {
	needTiming(t)
	onGPU(t, func(c *cuda.Ctx, k *Set, a *allocs, r *rand.Rand) {
		s := c.Stream()
		add := timingTable(t, c, a, r, 256<<20, "device-to-device copy 256 MiB (read+write)", "reference of this table")
		const H, nidx, T, nq = 128, 2048, 8192, 256
		cache := devMLACache(c, a, r, T)
		qn, qp, ip, lens, out := devMLAQueries(a, r, nq, H, nidx, T)
		ws := a.raw(MLAWorkspaceBytes(nq, H, mlaHeadsSplits))
		nb := float64(nq * (nidx*MLATokenBytes + 4*H*(512+64+512)))
		ns := k.MLATCSplits(nq, H, nidx)
		us := medianUs(c, s, 3, 7, func() {
			chk(k.MLADecodeTC(s, out, 0, qn, qp, cache, 0, ip, lens, ws, nq, H, nidx, nidx, ns, 0.1))
		})
		add(fmtName("mla_decode_tc H=%d topk=2048 nq=%d split=%d", H, nq, ns), nb, us, "the default prefill path")
		us = medianUs(c, s, 3, 7, func() {
			chk(k.MLAPrefillTC(s, out, 0, qn, qp, cache, 0, ip, lens, 0, nq, H, nidx, nidx, 1, 0.1))
		})
		add(fmtName("mla_prefill_tc H=%d topk=2048 nq=%d", H, nq), nb, us, "TILERT_GPU_MLA_PREFILL=1")
		us = medianUs(c, s, 3, 7, func() {
			chk(k.MLAPrefillTCP(s, out, 0, qn, qp, cache, 0, ip, lens, 0, nq, H, nidx, nidx, 1, 0.1))
		})
		add(fmtName("mla_prefill_tcp H=%d topk=2048 nq=%d", H, nq), nb, us, "TILERT_GPU_MLA_PREFILL=2")
		us = medianUs(c, s, 3, 7, func() {
			chk(k.MLAPrefillTCPI(s, out, 0, qn, qp, cache, 0, ip, lens, 0, nq, H, nidx, nidx, 1, 0.1))
		})
		add(fmtName("mla_prefill_tcpi H=%d topk=2048 nq=%d", H, nq), nb, us, "integer fp8 conversion")
		us = medianUs(c, s, 3, 7, func() {
			chk(k.MLADecodeTCP(s, out, 0, qn, qp, cache, 0, ip, lens, ws, nq, H, nidx, nidx, 1, 0.1))
		})
		add(fmtName("mla_decode_tcp H=%d topk=2048 nq=%d split=1", H, nq), nb, us, "its decode twin, unsplit")
	})
}
