package kernels

// mla_prefill_h1 (cu/mla_tc_prefill_h1.cu) without a GPU: its inputs, its
// two references and their bounds (used by the GPU check too), and a
// lane-by-lane transcription of the kernel (the same shared-memory byte
// addresses, ldmatrix / ldmatrix.trans and mma.sync m16n8k16 fragment
// layouts, conversions and online softmax) that must pass the same check:
// it pins the index and fragment math here, before any device run.
//
// Why the bound is what it is (one fp16 part; u = 2^-11, fp16's unit
// roundoff):
//   - q: per head scaled by a power of two (exact) so max|q| is in
//     [2^14, 2^15), rounded once: |dq| <= u|q|.
//   - k = v (the dequantised latent): fp16(fp16(e4m3 x fp16(scale x 2^-E))
//     x 2^E): the scale's rounding and the product's: |dk| <= (2u+u^2)|k|;
//     the bf16 RoPE part rounded once: |dk| <= u|k|; plus fp16's subnormal
//     spacing 2^-24 where a value is below 2^-14.
//   - each product then carries <= 3.01u relative, so a score moves by at
//     most eps = scale x (3.01u sum_d |q_d k_d| + 2^-24 sum_d |q_d|) plus
//     the float32 accumulation (36 chained mma, each rounding a sum of 16
//     exact products and the accumulator: <= 160 x 2^-24 sum|q.k|
//     scaled) and exp2's / the factor's float32 rounding (2^-22 (1+|s|)).
//   - scores moved by <= eps move the normalised weights by factors within
//     e^(+-2 eps), so the output moves by <= (e^(2 eps) - 1) max|v|; the
//     fp16 probabilities (the row sum l is taken from the unrounded ones)
//     add u max|v| (+ n 2^-25 max|v| for probabilities below 2^-14), the
//     fp16 values 2.01u max|v| + 2^-23, the float32 P.V accumulation
//     2^-15 max|v|.
//   bound_exact = (e^(2 eps) - 1 + 3.01u + 2^-15 + n 2^-25) max|v| + 2^-23
//   against float64 on the exact inputs (max|v| over the row's selected
//   entries). This is a worst case (scores of a few units: ~1e-2 of max|v|).
//   A sharper check rounds q and k as the kernel does (the "emulated"
//   reference): then only the probabilities' rounding and float32 remain,
//   bound_emu = (e^(2 eps32) - 1 + u + 2^-15 + n 2^-25) max|v| with eps32
//   the float32 terms alone: ~5e-4 of max|v|, so a wrong, missing or extra
//   entry (weight ~1/n of a row's softmax over n <= 192 entries) or a wrong
//   scale shows far above it.
//   lse: |d| <= eps (+ 2^-16 (1 + |lse|)).

import (
	"math"
	"math/rand/v2"
	"testing"
)

// h1Round rounds x to the nearest fp16 value (ties to even, subnormals,
// overflow to infinity), as cvt.rn.f16 and mul.rn.f16x2 do.
func h1Round(x float64) float64 {
	a := math.Abs(x)
	if a == 0 || math.IsNaN(a) || math.IsInf(a, 0) {
		return x
	}
	q := math.Ldexp(1, -24)
	if a >= math.Ldexp(1, -14) {
		q = math.Ldexp(1, math.Ilogb(a)-10)
	}
	r := math.RoundToEven(x/q) * q
	if math.Abs(r) > 65504 {
		return math.Copysign(math.Inf(1), r)
	}
	return r
}

// h1Bits is the fp16 encoding of a value fp16 holds exactly.
func h1Bits(x float64) uint16 {
	if math.IsNaN(x) {
		return 0x7e00
	}
	var s uint16
	if math.Signbit(x) {
		s, x = 0x8000, -x
	}
	switch {
	case math.IsInf(x, 0):
		return s | 0x7c00
	case x == 0:
		return s
	case x < math.Ldexp(1, -14):
		return s | uint16(x/math.Ldexp(1, -24))
	}
	e := math.Ilogb(x)
	return s | uint16(e+15)<<10 | uint16((x/math.Ldexp(1, e)-1)*1024)
}

func h1Val(u uint16) float64 {
	s := 1.0
	if u&0x8000 != 0 {
		s = -1
	}
	e, m := int(u>>10&31), float64(u&1023)
	switch e {
	case 0:
		return s * m * math.Ldexp(1, -24)
	case 31:
		if m != 0 {
			return math.NaN()
		}
		return s * math.Inf(1)
	}
	return s * (1 + m/1024) * math.Ldexp(1, e-15)
}

// h1QExp is the kernel's per-head exponent: max|q| x 2^e in [2^14, 2^15).
func h1QExp(mx float32) int {
	e := 0
	if mx > 0 {
		e = 14 - (int(math.Float32bits(mx)>>23&0xff) - 127)
	}
	return min(max(e, -126), 126)
}

// h1ScaleParts is mh1_scale: fp16(scale x 2^-E) and 2^E.
func h1ScaleParts(sc float32) (m16, p2 float64) {
	E := int(math.Float32bits(sc)>>23&0xff) - 127
	E = min(max(E, -24), 15)
	m := sc * float32(math.Ldexp(1, -E))
	return h1Round(float64(m)), math.Ldexp(1, E)
}

// h1Latent is the kernel's fp16 latent value of an e4m3 byte under scale sc.
func h1Latent(b byte, sc float32) float64 {
	m16, p2 := h1ScaleParts(sc)
	return h1Round(h1Round(fp8Table[b]*m16) * p2)
}

// h1Case is one launch's inputs.
type h1Case struct {
	nq, H, nidx, ldIdx, T int
	cache                 []byte
	qn, qp                []float32
	idx, lens             []int32
	scale                 float32
}

// newH1Case: rows of a causal chunk (row i's length base + 3i), each with
// its own number of valid selections (one row none, one row exactly nidx,
// one row 5 in the first positions as the engine's top-k pads a short
// row, others 1..nidx) at random positions among -1 padding, one entry at or
// past the row's length (skipped), and entries past nidx (up to ldIdx)
// that must never be read.
func newH1Case(r *rand.Rand, nq, H, nidx, ldIdx int, scale float32) *h1Case {
	base := nidx + 8
	c := &h1Case{nq: nq, H: H, nidx: nidx, ldIdx: ldIdx, T: base + 3*nq + 8, scale: scale}
	c.cache = randMLACache(r, c.T)
	c.lens = make([]int32, nq)
	c.idx = make([]int32, nq*ldIdx)
	for qi := range nq {
		l := base + 3*qi
		c.lens[qi] = int32(l)
		row := c.idx[qi*ldIdx : (qi+1)*ldIdx]
		for j := range row {
			row[j] = -1
		}
		for j := nidx; j < ldIdx; j++ {
			row[j] = int32(r.IntN(l)) // past nidx: not read
		}
		var nv int
		switch {
		case qi == 1:
			nv = 0
		case qi == 2:
			nv = nidx
		default:
			nv = 1 + r.IntN(nidx-1)
		}
		pos := r.Perm(nidx)
		if qi == 3 {
			// A causal row's short selection: valid entries first, then
			// -1 (later tiles have no valid slot and are skipped).
			nv = min(5, nidx)
			for i := range pos {
				pos[i] = i
			}
		}
		for i, tk := range r.Perm(l)[:nv] {
			row[pos[i]] = int32(tk)
		}
		if nv < nidx && qi != 1 {
			row[pos[nv]] = int32(l + r.IntN(8)) // at or past the row's length: skipped
		}
	}
	c.qn = randF32(r, nq*H*MLALatentDim, 1)
	c.qp = randF32(r, nq*H*MLARopeDim, 1)
	return c
}

// check compares a launch's output and lse with the two references; it
// returns the worst |d|/bound of each (output vs exact, vs emulated, lse).
func (c *h1Case) check(out, lse []float32) (worstExact, worstEmu, worstLse, maxRel float64) {
	const u = 1.0 / 2048
	T := c.T
	kv := make([][]float64, T)  // exact entries (576)
	khv := make([][]float64, T) // as the kernel rounds them
	for tk := range T {
		row := c.cache[tk*MLATokenBytes:]
		kv[tk], khv[tk] = make([]float64, 576), make([]float64, 576)
		for d := range 512 {
			sc := getF32(row[512+4*(d/128):])
			kv[tk][d] = fp8Table[row[d]] * float64(sc)
			khv[tk][d] = h1Latent(row[d], sc)
		}
		for i := range 64 {
			v := bf16ToF64(uint16(row[528+2*i]) | uint16(row[529+2*i])<<8)
			kv[tk][512+i], khv[tk][512+i] = v, h1Round(v)
		}
	}
	for qi := range c.nq {
		var toks []int
		for j := range c.nidx {
			if t := c.idx[qi*c.ldIdx+j]; t >= 0 && t < c.lens[qi] {
				toks = append(toks, int(t))
			}
		}
		var maxV float64
		for _, tk := range toks {
			for d := range 512 {
				maxV = math.Max(maxV, math.Max(math.Abs(kv[tk][d]), math.Abs(khv[tk][d])))
			}
		}
		n := float64(len(toks))
		for h := range c.H {
			q := make([]float64, 576)
			var mx float32
			for d := range 576 {
				var v float32
				if d < 512 {
					v = c.qn[(qi*c.H+h)*512+d]
				} else {
					v = c.qp[(qi*c.H+h)*64+d-512]
				}
				q[d] = float64(v)
				mx = max(mx, float32(math.Abs(float64(v))))
			}
			e := h1QExp(mx)
			qh := make([]float64, 576)
			for d := range 576 {
				qh[d] = h1Round(float64(float32(q[d])*float32(math.Ldexp(1, e)))) * math.Ldexp(1, -e)
			}
			sc := float64(c.scale)
			// Scores, exact and emulated, and the per-row score error bounds.
			se, sh := make([]float64, len(toks)), make([]float64, len(toks))
			var sumQK, sumQKh, sumQ, maxS float64
			for d := range 576 {
				sumQ += math.Abs(q[d])
			}
			for j, tk := range toks {
				var a, b, aa, bb float64
				for d := range 576 {
					a += q[d] * kv[tk][d]
					b += qh[d] * khv[tk][d]
					aa += math.Abs(q[d] * kv[tk][d])
					bb += math.Abs(qh[d] * khv[tk][d])
				}
				se[j], sh[j] = a*sc, b*sc
				sumQK, sumQKh = math.Max(sumQK, aa), math.Max(sumQKh, bb)
				maxS = math.Max(maxS, math.Abs(b*sc))
			}
			eps32 := sc*160*math.Ldexp(1, -24)*sumQKh + math.Ldexp(1, -22)*(1+maxS)
			eps := sc*(3.01*u*sumQK+math.Ldexp(1, -24)*sumQ) + eps32
			refO := func(s []float64, kk [][]float64) ([]float64, float64) {
				o := make([]float64, 512)
				if len(s) == 0 {
					return o, math.Inf(-1)
				}
				m := math.Inf(-1)
				for _, v := range s {
					m = math.Max(m, v)
				}
				var l float64
				for j, tk := range toks {
					p := math.Exp(s[j] - m)
					l += p
					for d := range 512 {
						o[d] += p * kk[tk][d]
					}
				}
				for d := range o {
					o[d] /= l
				}
				return o, m + math.Log(l)
			}
			oe, le := refO(se, kv)
			oh, lh := refO(sh, khv)
			bExact := (math.Expm1(2*eps)+3.01*u+math.Ldexp(1, -15)+n*math.Ldexp(1, -25))*maxV + math.Ldexp(1, -23)
			bEmu := (math.Expm1(2*eps32)+u+math.Ldexp(1, -15)+n*math.Ldexp(1, -25))*maxV + math.Ldexp(1, -30)
			for d := range 512 {
				g := float64(out[(qi*c.H+h)*512+d])
				if math.IsNaN(g) {
					return math.Inf(1), math.Inf(1), math.Inf(1), math.Inf(1)
				}
				worstExact = math.Max(worstExact, math.Abs(g-oe[d])/bExact)
				worstEmu = math.Max(worstEmu, math.Abs(g-oh[d])/bEmu)
				if maxV > 0 {
					maxRel = math.Max(maxRel, math.Abs(g-oe[d])/maxV)
				}
			}
			if lse == nil {
				continue
			}
			gl := float64(lse[qi*c.H+h])
			switch {
			case math.IsInf(le, -1):
				if !math.IsInf(gl, -1) {
					worstLse = math.Inf(1)
				}
			case math.IsNaN(gl):
				worstLse = math.Inf(1)
			default:
				bl := eps + math.Ldexp(1, -16)*(1+math.Abs(le))
				worstLse = math.Max(worstLse, math.Abs(gl-le)/bl)
				_ = lh
			}
		}
	}
	return worstExact, worstEmu, worstLse, maxRel
}

// h1Transcribe runs mla_prefill_h1 block by block, each block's threads
// phase by phase (the phases its barriers separate), on a byte image of its
// shared memory.
func h1Transcribe(c *h1Case) (out, lse []float32) {
	out, lse = make([]float32, c.nq*c.H*512), make([]float32, c.nq*c.H)
	for i := range out {
		out[i] = float32(math.NaN())
	}
	for i := range lse {
		lse[i] = float32(math.NaN())
	}
	tps := cdiv(c.nidx, mlaPrefillH1Tile) * mlaPrefillH1Tile
	for qi := range c.nq {
		for z := range cdiv(c.H, mlaPrefillH1Heads) {
			h1Block(c, qi, z, tps, out, lse)
		}
	}
	return out, lse
}

const (
	h1OffKt   = 64 * MLATokenBytes
	h1OffQs   = h1OffKt + 64*584*2
	h1OffPs   = h1OffQs + 64*584*2
	h1OffRedm = h1OffPs + 64*72*2
	h1OffAlph = h1OffRedm + 2*64*4
	h1OffQsc  = h1OffAlph + 64*4
	h1OffLsum = h1OffQsc + 64*4
)

type h1Smem []byte

func (m h1Smem) h(addr int) uint16       { return uint16(m[addr]) | uint16(m[addr+1])<<8 }
func (m h1Smem) setH(addr int, v uint16) { m[addr], m[addr+1] = byte(v), byte(v>>8) }
func (m h1Smem) f(addr int) float32      { return getF32(m[addr:]) }
func (m h1Smem) setF(addr int, v float32) {
	putF32(m[addr:], v)
}

// ldsm4 is ldmatrix.x4 (.trans with tr): lane l names row l%8 of matrix l/8.
func (m h1Smem) ldsm4(addr [32]int, tr bool) (r [32][4]uint32) {
	for t := range 32 {
		for i := range 4 {
			var lo, hi uint16
			if tr {
				lo = m.h(addr[8*i+2*(t%4)] + 2*(t/4))
				hi = m.h(addr[8*i+2*(t%4)+1] + 2*(t/4))
			} else {
				lo = m.h(addr[8*i+t/4] + 2*(2*(t%4)))
				hi = m.h(addr[8*i+t/4] + 2*(2*(t%4)+1))
			}
			r[t][i] = uint32(lo) | uint32(hi)<<16
		}
	}
	return r
}

// h1MMA is mma.sync m16n8k16 row.col f32.f16.f16.f32 over a warp's fragments.
func h1MMA(c *[32][4]float32, a [32][4]uint32, b [32][2]uint32) {
	var A [16][16]float64
	var B [16][8]float64
	lo := func(x uint32) float64 { return h1Val(uint16(x)) }
	hi := func(x uint32) float64 { return h1Val(uint16(x >> 16)) }
	for t := range 32 {
		g, t4 := t/4, t%4
		A[g][2*t4], A[g][2*t4+1] = lo(a[t][0]), hi(a[t][0])
		A[g+8][2*t4], A[g+8][2*t4+1] = lo(a[t][1]), hi(a[t][1])
		A[g][2*t4+8], A[g][2*t4+9] = lo(a[t][2]), hi(a[t][2])
		A[g+8][2*t4+8], A[g+8][2*t4+9] = lo(a[t][3]), hi(a[t][3])
		B[2*t4][g], B[2*t4+1][g] = lo(b[t][0]), hi(b[t][0])
		B[2*t4+8][g], B[2*t4+9][g] = lo(b[t][1]), hi(b[t][1])
	}
	for t := range 32 {
		g, t4 := t/4, t%4
		for e := range 4 {
			row, col := g+8*(e>>1), 2*t4+(e&1)
			s := float64(c[t][e])
			for k := range 16 {
				s += A[row][k] * B[k][col]
			}
			c[t][e] = float32(s)
		}
	}
}

// h1Gather is a block's view of query row qi's selections: slot(j) is the
// cache token of selection j (-1 past the first min(nidx, tps), outside
// the row's length, or padding), sl the three 64-slot rings primed with
// tiles 0 and 1, and issue copies a ring's raw entries into the shared
// tile, as the kernels' cp.async gather does (mla_prefill_h1, _wg).
type h1Gather struct {
	c                *h1Case
	qi, begin, count int
	nt               int
	sl               [3][64]int32
}

func newH1Gather(c *h1Case, qi, tps int) *h1Gather { return newH1GatherAt(c, qi, 0, tps) }

// newH1GatherAt gathers the selections [begin, begin + tps) of row qi (a
// split decode block's range; slot j is selection begin + j).
func newH1GatherAt(c *h1Case, qi, begin, tps int) *h1Gather {
	g := &h1Gather{c: c, qi: qi, begin: begin, count: min(c.nidx, begin+tps)}
	g.nt = cdiv(max(0, g.count-begin), 64)
	for j := range 128 {
		g.sl[j/64][j%64] = g.slot(j)
	}
	return g
}

func (g *h1Gather) slot(j int) int32 {
	if g.begin+j >= g.count {
		return -1
	}
	t := g.c.idx[g.qi*g.c.ldIdx+g.begin+j]
	if t < 0 || int(t) >= int(g.c.lens[g.qi]) {
		return -1
	}
	return t
}

func (g *h1Gather) issue(m h1Smem, s *[64]int32) {
	for j, t := range s {
		if t >= 0 {
			copy(m[j*MLATokenBytes:(j+1)*MLATokenBytes], g.c.cache[int(t)*MLATokenBytes:])
		}
	}
}

// h1QueryRow is head h's query of row qi (576 values, zero past c.H), the
// power of two f that brings its largest |value| to the fp16 range the
// kernels round at, and the softmax factor they keep for it (scale x
// log2(e) / f).
func h1QueryRow(c *h1Case, qi, h int) (v []float32, f, qsc float32) {
	v = make([]float32, 576)
	if h < c.H {
		copy(v, c.qn[(qi*c.H+h)*512:(qi*c.H+h+1)*512])
		copy(v[512:], c.qp[(qi*c.H+h)*64:(qi*c.H+h+1)*64])
	}
	var mx float32
	for _, x := range v {
		mx = max(mx, float32(math.Abs(float64(x))))
	}
	e := h1QExp(mx)
	return v, float32(math.Ldexp(1, e)), c.scale * float32(1.4426950408889634) * float32(math.Ldexp(1, -e))
}

func h1Block(c *h1Case, qi, z, tps int, out, lse []float32) {
	m := make(h1Smem, MLAPrefillH1SmemBytes)
	for i := range h1OffKt {
		m[i] = 0xff // stale raw bytes: NaN entries and scales
	}
	h0 := z * 64
	g := newH1Gather(c, qi, tps)
	nt, sl, slot := g.nt, g.sl, g.slot
	issue := func(s *[64]int32) { g.issue(m, s) }
	if nt > 0 {
		issue(&sl[0])
	}
	// Queries.
	for hh := range 64 {
		v, f, qsc := h1QueryRow(c, qi, h0+hh)
		m.setF(h1OffQsc+4*hh, qsc)
		for d, x := range v {
			m.setH(h1OffQs+2*(hh*584+d), h1Bits(h1Round(float64(x*f))))
		}
	}
	var o [8][32][4][8][4]float32 // [warp][lane][mt][n][e]
	var m0, m1, l0, l1 [8][32]float32
	for w := range 8 {
		for l := range 32 {
			m0[w][l], m1[w][l] = float32(math.Inf(-1)), float32(math.Inf(-1))
		}
	}
	for k := range nt {
		slk := sl[k%3]
		var nslot [64]int32
		any := false
		for tid := range 64 {
			nslot[tid] = slot((k+2)*64 + tid)
			any = any || slk[tid] >= 0
		}
		if !any {
			if k+1 < nt {
				issue(&sl[(k+1)%3])
			}
			sl[(k+2)%3] = nslot
			continue
		}
		// Conversion.
		for tid := range 256 {
			for i := range 16 {
				j, s8 := 4*i+tid>>6, tid&63
				dst := h1OffKt + 2*(j*584+8*s8)
				for e := range 8 {
					var v float64
					if slk[j] >= 0 {
						rj := j * MLATokenBytes
						v = h1Latent(m[rj+8*s8+e], m.f(rj+512+4*(s8>>4)))
					}
					m.setH(dst+2*e, h1Bits(v))
				}
			}
			for i := range 2 {
				cc := 256*i + tid
				j, r := cc>>3, cc&7
				for e := range 8 {
					var v float64
					if slk[j] >= 0 {
						rb := j*MLATokenBytes + 528 + 16*r + 2*e
						v = h1Round(bf16ToF64(m.h(rb)))
					}
					m.setH(h1OffKt+2*(j*584+512+8*r+e), h1Bits(v))
				}
			}
		}
		if k+1 < nt {
			issue(&sl[(k+1)%3])
		}
		// QK and the row maxima.
		var s [8][32][4][4]float32
		for w := range 8 {
			hg, th := w&3, w>>2
			var qa, kb [32]int
			for l := range 32 {
				qa[l] = h1OffQs + ((16*hg+(l&7)+8*((l>>3)&1))*584+8*(l>>4))*2
				kb[l] = h1OffKt + ((32*th+8*(l>>4)+(l&7))*584+8*((l>>3)&1))*2
			}
			var acc [4][32][4]float32
			for ks := range 36 {
				var qa2, kb2, kb3 [32]int
				for l := range 32 {
					qa2[l], kb2[l], kb3[l] = qa[l]+32*ks, kb[l]+32*ks, kb[l]+16*584*2+32*ks
				}
				a := m.ldsm4(qa2, false)
				b0, b1 := m.ldsm4(kb2, false), m.ldsm4(kb3, false)
				for n := range 4 {
					var bb [32][2]uint32
					for l := range 32 {
						src := b0
						if n >= 2 {
							src = b1
						}
						bb[l] = [2]uint32{src[l][2*(n%2)], src[l][2*(n%2)+1]}
					}
					h1MMA(&acc[n], a, bb)
				}
			}
			for l := range 32 {
				g, t4 := l/4, l%4
				hr0, hr1 := 16*hg+g, 16*hg+g+8
				f0, f1 := m.f(h1OffQsc+4*hr0), m.f(h1OffQsc+4*hr1)
				ninf := float32(math.Inf(-1))
				for n := range 4 {
					col := 32*th + 8*n + 2*t4
					va, vb := slk[col] >= 0, slk[col+1] >= 0
					x := acc[n][l]
					s[w][l][n] = [4]float32{ninf, ninf, ninf, ninf}
					if va {
						s[w][l][n][0], s[w][l][n][2] = x[0]*f0, x[2]*f1
					}
					if vb {
						s[w][l][n][1], s[w][l][n][3] = x[1]*f0, x[3]*f1
					}
				}
			}
			for g := range 8 {
				mx0, mx1 := float32(math.Inf(-1)), float32(math.Inf(-1))
				for t4 := range 4 {
					for n := range 4 {
						x := s[w][4*g+t4][n]
						mx0 = max(mx0, x[0], x[1])
						mx1 = max(mx1, x[2], x[3])
					}
				}
				m.setF(h1OffRedm+4*(th*64+16*hg+g), mx0)
				m.setF(h1OffRedm+4*(th*64+16*hg+g+8), mx1)
			}
		}
		// Softmax and P.
		for w := range 8 {
			hg, th := w&3, w>>2
			for l := range 32 {
				g, t4 := l/4, l%4
				hr := [2]int{16*hg + g, 16*hg + g + 8}
				ms := [2]*float32{&m0[w][l], &m1[w][l]}
				ls := [2]*float32{&l0[w][l], &l1[w][l]}
				for r := range 2 {
					nm := max(*ms[r], m.f(h1OffRedm+4*hr[r]), m.f(h1OffRedm+4*(64+hr[r])))
					ninf := float32(math.Inf(-1))
					al := float32(1)
					if nm != ninf {
						al = float32(math.Exp2(float64(*ms[r] - nm)))
					}
					var sum float32
					for n := range 4 {
						for e := range 2 {
							p := float32(0)
							if nm != ninf {
								p = float32(math.Exp2(float64(s[w][l][n][2*r+e] - nm)))
							}
							sum += p
							m.setH(h1OffPs+2*(hr[r]*72+32*th+8*n+2*t4+e), h1Bits(h1Round(float64(p))))
						}
					}
					*ls[r] = *ls[r]*al + sum
					*ms[r] = nm
					if th == 0 && t4 == 0 {
						m.setF(h1OffAlph+4*hr[r], al)
					}
				}
			}
		}
		// P.V.
		for w := range 8 {
			for l := range 32 {
				g := l / 4
				for mt := range 4 {
					a0, a1 := m.f(h1OffAlph+4*(16*mt+g)), m.f(h1OffAlph+4*(16*mt+g+8))
					for n := range 8 {
						o[w][l][mt][n][0] *= a0
						o[w][l][mt][n][1] *= a0
						o[w][l][mt][n][2] *= a1
						o[w][l][mt][n][3] *= a1
					}
				}
			}
			for kk := range 4 {
				var pa [4][32][4]uint32
				var vb [4][32][4]uint32
				for mt := range 4 {
					var ad [32]int
					for l := range 32 {
						ad[l] = h1OffPs + (((l&7)+8*((l>>3)&1))*72+8*(l>>4))*2 + 16*mt*72*2 + 32*kk
					}
					pa[mt] = m.ldsm4(ad, false)
				}
				for jj := range 4 {
					var ad [32]int
					for l := range 32 {
						ad[l] = h1OffKt + (((l&7)+8*((l>>3)&1))*584+64*w+8*(l>>4))*2 + 16*kk*584*2 + 32*jj
					}
					vb[jj] = m.ldsm4(ad, true)
				}
				for mt := range 4 {
					for jj := range 4 {
						for half := range 2 {
							var acc [32][4]float32
							var bb [32][2]uint32
							for l := range 32 {
								acc[l] = o[w][l][mt][2*jj+half]
								bb[l] = [2]uint32{vb[jj][l][2*half], vb[jj][l][2*half+1]}
							}
							h1MMA(&acc, pa[mt], bb)
							for l := range 32 {
								o[w][l][mt][2*jj+half] = acc[l]
							}
						}
					}
				}
			}
		}
		sl[(k+2)%3] = nslot
	}
	// Row sums, lse, output.
	for w := range 8 {
		hg, th := w&3, w>>2
		for g := range 8 {
			var s0, s1 float32
			for t4 := range 4 {
				s0 += l0[w][4*g+t4]
				s1 += l1[w][4*g+t4]
			}
			m.setF(h1OffLsum+4*(th*64+16*hg+g), s0)
			m.setF(h1OffLsum+4*(th*64+16*hg+g+8), s1)
		}
	}
	for w := range 4 {
		for g := range 8 {
			for r := range 2 {
				hb := 16*w + g + 8*r
				h := h0 + hb
				l := m.f(h1OffLsum+4*hb) + m.f(h1OffLsum+4*(64+hb))
				mm := m0[w][4*g]
				if r == 1 {
					mm = m1[w][4*g]
				}
				if h < c.H {
					v := float32(math.Inf(-1))
					if l > 0 {
						v = mm*0.6931471805599453 + float32(math.Log(float64(l)))
					}
					lse[qi*c.H+h] = v
				}
			}
		}
	}
	for w := range 8 {
		for l := range 32 {
			g, t4 := l/4, l%4
			for mt := range 4 {
				for hr := range 2 {
					hb := 16*mt + g + 8*hr
					h := h0 + hb
					if h >= c.H {
						continue
					}
					ls := m.f(h1OffLsum+4*hb) + m.f(h1OffLsum+4*(64+hb))
					inv := float32(0)
					if ls > 0 {
						inv = 1 / ls
					}
					for n := range 8 {
						col := 64*w + 8*n + 2*t4
						out[(qi*c.H+h)*512+col] = o[w][l][mt][n][2*hr] * inv
						out[(qi*c.H+h)*512+col+1] = o[w][l][mt][n][2*hr+1] * inv
					}
				}
			}
		}
	}
}

// TestMLAPrefillH1Transcribed: the kernel's transcription passes the GPU
// check's bounds on its inputs (two head blocks, the second part-filled;
// tiny-model heads), and the bounds are not vacuous: a transcription with
// one selected entry dropped per row fails the emulated bound.
func TestMLAPrefillH1Transcribed(t *testing.T) {
	r := rand.New(rand.NewPCG(11, 7))
	for _, cs := range []struct{ nq, H, nidx, ldIdx int }{{5, 72, 150, 160}, {4, 4, 32, 32}, {3, 128, 300, 304}} {
		c := newH1Case(r, cs.nq, cs.H, cs.nidx, cs.ldIdx, 0.1)
		out, lse := h1Transcribe(c)
		we, wh, wl, rel := c.check(out, lse)
		t.Logf("nq=%d H=%d nidx=%d: |d|/bound exact %.3g, emulated %.3g, lse %.3g; max|d|/max|v| %.3g", cs.nq, cs.H, cs.nidx, we, wh, wl, rel)
		if !(we <= 1 && wh <= 1 && wl <= 1) {
			t.Errorf("nq=%d H=%d: transcription outside the bounds: exact %g emulated %g lse %g", cs.nq, cs.H, we, wh, wl)
		}
		// A dropped entry: each row's first valid selection replaced by -1.
		bad := *c
		bad.idx = append([]int32(nil), c.idx...)
		for qi := range c.nq {
			for j := range c.nidx {
				if v := bad.idx[qi*c.ldIdx+j]; v >= 0 && v < c.lens[qi] {
					bad.idx[qi*c.ldIdx+j] = -1
					break
				}
			}
		}
		out2, lse2 := h1Transcribe(&bad)
		if _, wh2, _, _ := c.check(out2, lse2); wh2 <= 1 {
			t.Errorf("nq=%d H=%d: one entry dropped per row passes the emulated bound (%g)", cs.nq, cs.H, wh2)
		} else {
			t.Logf("one entry dropped per row: emulated |d|/bound %.3g", wh2)
		}
	}
}
