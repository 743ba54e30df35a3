package kernels

// mla_prefill_wg (cu/wg/mla_prefill_wg.cu) without a GPU: a lane-by-lane
// transcription of the kernel on a byte image of its shared memory, as
// TestMLAPrefillH1Transcribed does for mla_prefill_h1, with the two
// products through a model of wgmma.mma_async m64nNk16 .f32.f16.f16 with
// shared-memory descriptors:
//   - the descriptor's fields (start address / 16 in bits 0-13, leading
//     byte offset / 16 in 16-29, stride byte offset / 16 in 32-45, base
//     offset 49-51 and swizzle mode 62-63 both 0: no swizzle);
//   - the canonical no-swizzle layouts (PTX ISA "Shared Memory Matrix
//     Layout"; CUTLASS make_gmma_desc): 8 x 16-byte core matrices of 128
//     contiguous bytes; K-major: element (row r of M/N, k) at start +
//     (r/8) SBO + (k/8) LBO + (r%8) 16 + (k%8) 2; MN-major (imm-trans-b =
//     1): element (k, n) at start + (n/8) SBO + (k/8) LBO + (k%8) 16 +
//     (n%8) 2;
//   - the accumulator fragment: thread t of the warpgroup holds d[4i + c]
//     = D[16 (t/32) + (t%32)/4 + 8 (c/2)][8i + 2 (t%4) + c%2];
//   - one k16 step adds its 16 exact products to the float32 accumulator
//     with one rounding (the hardware's order within the step is its own:
//     float32 summation order, inside the bounds).
// The kernel's writers (queries, tile, P at MWG_OFF), its descriptors, its
// fragment use (softmax, rescale, output) are transcribed from the .cu; the
// lines transcribed are checked to still be in the source (wgSourceLines),
// so an edit of the kernel fails here until the transcription follows.
// What this does NOT check: that the hardware reads the layouts as the
// model says (the model is the documentation's, not a measurement), the
// proxy fences and barriers (the transcription runs phase by phase), and
// anything about timing. The GPU check (mla_prefill_wg_test.go) does.
//
// The bounds are mla_prefill_h1's (the same roundings; h1Case.check).

import (
	"math"
	"math/rand/v2"
	"strings"
	"testing"
)

// wgSourceLines are the kernel lines the transcription below copies.
var wgSourceLines = []string{
	"// 2,304 = 199,936 bytes (one block an SM).",
	"#define MWG_TILE_BYTES (72 * 8 * 128)  // 64 rows x 576 halves",
	"#define MWG_P_BYTES (8 * 8 * 128)      // 64 heads x 64 tokens halves",
	"#define MWG_OFF(r, c) (((((c) >> 3) * 8 + ((r) >> 3)) << 7) + (((r) & 7) << 4) + (((c) & 7) << 1))",
	"return (u64)((addr & 0x3ffffu) >> 4) | ((u64)(lbo >> 4) << 16) | ((u64)(sbo >> 4) << 32);",
	"*(uint2*)(Qs + MWG_OFF(hh, d)) =",
	"const int d = i < 4 ? 4 * (lane + 32 * i) : MLA_LAT + 4 * lane;",
	"const int j = tid & 63;",
	"const int s8 = 4 * i + (tid >> 6);",
	"*(uint4*)(Kt + MWG_OFF(j, 8 * s8)) = hv;",
	"const int r = 4 * i + (tid >> 6);",
	"*(uint4*)(Kt + MWG_OFF(j, MLA_LAT + 8 * r)) = hv;",
	"const u32 qk_a0 = qs_a, qk_b0 = kt_a + (u32)(4 * th) * 128u;",
	"mwg_m64n32<0>(s, mwg_desc(qk_a0 + 2048u * ks, 1024u, 128u), mwg_desc(qk_b0 + 2048u * ks, 1024u, 128u));",
	"const u32 pv_b0 = kt_a + (u32)(32 * th * 8) * 128u;",
	"mwg_m64n256<1>(o, mwg_desc(ps_a + 2048u * kk, 1024u, 128u), mwg_desc(pv_b0 + 256u * kk, 128u, 1024u));",
	"*(u32*)(Ps + MWG_OFF(hr0, col)) = mwg_f16x2(s[4 * n + 0], s[4 * n + 1]);",
	"*(u32*)(Ps + MWG_OFF(hr1, col)) = mwg_f16x2(s[4 * n + 2], s[4 * n + 3]);",
	"const int col = 32 * th + 8 * n + 2 * t4;",
	"const float a0 = alph[hr0], a1 = alph[hr1];",
	"float* po = out + ((size_t)qi * H + h) * MLA_LAT + 256 * th + 2 * t4;",
	"*(float2*)(po + 8 * i) = make_float2(o[4 * i + 2 * hr] * inv, o[4 * i + 2 * hr + 1] * inv);",
	"\"wgmma.mma_async.sync.aligned.m64n32k16.f32.f16.f16 \"",
	"\"wgmma.mma_async.sync.aligned.m64n256k16.f32.f16.f16 \"",
	"\"%16, %17, 1, 1, 1, 0, %18;\"",
	"\"%128, %129, 1, 1, 1, 0, %130;\"",
}

const (
	wgOffKt   = 64 * MLATokenBytes
	wgOffQs   = wgOffKt + 72*8*128
	wgOffPs   = wgOffQs + 72*8*128
	wgOffRedm = wgOffPs + 8*8*128
	wgOffAlph = wgOffRedm + 2*64*4
	wgOffQsc  = wgOffAlph + 64*4
	wgOffLsum = wgOffQsc + 64*4
)

// mwgOff is MWG_OFF.
func mwgOff(r, c int) int { return (((c>>3)*8 + (r >> 3)) << 7) + ((r & 7) << 4) + ((c & 7) << 1) }

// mwgDesc is mwg_desc.
func mwgDesc(addr, lbo, sbo uint32) uint64 {
	return uint64((addr&0x3ffff)>>4) | uint64(lbo>>4)<<16 | uint64(sbo>>4)<<32
}

// wgDecode reads a descriptor as the model's hardware does; it fails the
// test on a field this model does not cover (swizzle, base offset,
// reserved bits).
func wgDecode(t testing.TB, d uint64) (start, lbo, sbo int) {
	const reserved = 3<<14 | 3<<30 | 7<<46 | 0x3ff<<52
	if d>>62 != 0 || d>>49&7 != 0 || d&reserved != 0 {
		t.Fatalf("descriptor %#x: swizzle, base offset or reserved bits set", d)
	}
	return int(d&0x3fff) << 4, int(d>>16&0x3fff) << 4, int(d>>32&0x3fff) << 4
}

// wgMMA is wgmma.mma_async m64nNk16 f32.f16.f16 (scale-d 1, scales 1,
// A K-major, B K-major or N-major with tnspB) for one warpgroup: d[t] is
// thread t's N/2 accumulators.
func (m h1Smem) wgMMA(t testing.TB, d [][]float32, N int, da, db uint64, tnspB bool) {
	as, al, asb := wgDecode(t, da)
	bs, bl, bsb := wgDecode(t, db)
	var A [64][16]float64
	B := make([][16]float64, N) // B[n][k]
	for r := range 64 {
		for k := range 16 {
			A[r][k] = h1Val(m.h(as + (r>>3)*asb + (k>>3)*al + (r&7)*16 + (k&7)*2))
		}
	}
	for n := range N {
		for k := range 16 {
			addr := bs + (n>>3)*bsb + (k>>3)*bl + (n&7)*16 + (k&7)*2
			if tnspB {
				addr = bs + (n>>3)*bsb + (k>>3)*bl + (k&7)*16 + (n&7)*2
			}
			B[n][k] = h1Val(m.h(addr))
		}
	}
	for th := range 128 {
		wq, l := th/32, th%32
		g, t4 := l/4, l%4
		for i := range N / 8 {
			for c := range 4 {
				row, col := 16*wq+g+8*(c>>1), 8*i+2*t4+(c&1)
				s := float64(d[th][4*i+c])
				for k := range 16 {
					s += A[row][k] * B[col][k]
				}
				d[th][4*i+c] = float32(s)
			}
		}
	}
}

// wgKnobs plant mistakes in the transcription (the test must catch them).
type wgKnobs struct {
	pvSwap  bool // P.V's B descriptor with LBO and SBO swapped
	pvNoTr  bool // P.V's B read K-major (imm-trans-b 0)
	qkHalf  bool // QK^T's B at the other warpgroup's tokens
	outCols bool // the output columns of the two warpgroups swapped
	// wg2: the tile written by mla_prefill_wg2's producer (wg2Fill, from
	// the cache in global memory) instead of wg's conversion; the
	// consumers are wg's code (TestMLAPrefillWG2ConsumersAreWG).
	wg2 bool
	// wg2Bad plants a mistake in wg2Fill (see there); 0 none.
	wg2Bad int
	// part: mla_decode_wg2's split block (DEC): the selections from
	// part.begin, the unnormalised partial written at split x of n.
	part *wgPart
}

// wgPart is one split of mla_decode_wg2: its range and mla_combine's
// partial buffers ([q H + h][n][512] and [..][2] = (max, sum)).
type wgPart struct {
	begin, x, n int
	o, ml       []float32
	bad         int // 1: the max left in log2 units; 2: the range's start ignored
}

func wgTranscribe(t testing.TB, c *h1Case, kn wgKnobs) (out, lse []float32) {
	out, lse = make([]float32, c.nq*c.H*512), make([]float32, c.nq*c.H)
	for i := range out {
		out[i] = float32(math.NaN())
	}
	for i := range lse {
		lse[i] = float32(math.NaN())
	}
	tps := cdiv(c.nidx, 64) * 64
	for qi := range c.nq {
		for z := range cdiv(c.H, 64) {
			wgBlock(t, c, kn, qi, z, tps, out, lse)
		}
	}
	return out, lse
}

func wgBlock(t testing.TB, c *h1Case, kn wgKnobs, qi, z, tps int, out, lse []float32) {
	m := make(h1Smem, MLAPrefillWGSmemBytes)
	for i := range wgOffKt {
		m[i] = 0xff // stale raw bytes: NaN entries and scales
	}
	for i := wgOffKt; i < wgOffRedm; i++ {
		m[i] = 0xfe // stale fp16 tiles: NaN
	}
	h0 := z * 64
	g := newH1Gather(c, qi, tps)
	if kn.part != nil {
		begin := kn.part.begin
		if kn.part.bad == 2 {
			begin = 0
		}
		g = newH1GatherAt(c, qi, begin, tps)
	}
	nt, sl, slot := g.nt, g.sl, g.slot
	issue := func(s *[64]int32) { g.issue(m, s) }
	if nt > 0 {
		issue(&sl[0])
	}
	// Queries: 4 halves at MWG_OFF(hh, d), d a multiple of 4.
	for hh := range 64 {
		v, f, qsc := h1QueryRow(c, qi, h0+hh)
		m.setF(wgOffQsc+4*hh, qsc)
		for d := 0; d < 576; d += 4 {
			for e := range 4 {
				m.setH(wgOffQs+mwgOff(hh, d)+2*e, h1Bits(h1Round(float64(v[d+e]*f))))
			}
		}
	}
	o := make([][]float32, 256) // [tid][128]
	for i := range o {
		o[i] = make([]float32, 128)
	}
	var m0, m1, l0, l1 [256]float32
	for i := range 256 {
		m0[i], m1[i] = float32(math.Inf(-1)), float32(math.Inf(-1))
	}
	ninf := float32(math.Inf(-1))
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
		// Conversion: token j = tid % 64, units 4i + tid/64.
		if kn.wg2 {
			wg2Fill(t, m, c.cache, &slk, kn.wg2Bad)
		}
		for tid := range 256 {
			if kn.wg2 {
				break
			}
			j := tid & 63
			ok := slk[j] >= 0
			rj := j * MLATokenBytes
			for i := range 16 {
				s8 := 4*i + tid>>6
				dst := wgOffKt + mwgOff(j, 8*s8)
				for e := range 8 {
					var v float64
					if ok {
						v = h1Latent(m[rj+8*s8+e], m.f(rj+512+4*(s8>>4)))
					}
					m.setH(dst+2*e, h1Bits(v))
				}
			}
			for i := range 2 {
				r := 4*i + tid>>6
				dst := wgOffKt + mwgOff(j, 512+8*r)
				for e := range 8 {
					var v float64
					if ok {
						v = h1Round(bf16ToF64(m.h(rj + 528 + 16*r + 2*e)))
					}
					m.setH(dst+2*e, h1Bits(v))
				}
			}
		}
		if k+1 < nt {
			issue(&sl[(k+1)%3])
		}
		// QK^T per warpgroup, then the masks and the row maxima.
		var s [256][16]float32
		for th := range 2 {
			acc := make([][]float32, 128)
			for i := range acc {
				acc[i] = make([]float32, 16)
			}
			bth := th
			if kn.qkHalf {
				bth = 1 - th
			}
			for ks := range 36 {
				m.wgMMA(t, acc, 32, mwgDesc(uint32(wgOffQs+2048*ks), 1024, 128), mwgDesc(uint32(wgOffKt+4*bth*128+2048*ks), 1024, 128), false)
			}
			for tw := range 128 {
				tid := 128*th + tw
				hg, l := tw/32, tw%32
				g, t4 := l/4, l%4
				hr0, hr1 := 16*hg+g, 16*hg+g+8
				f0, f1 := m.f(wgOffQsc+4*hr0), m.f(wgOffQsc+4*hr1)
				for n := range 4 {
					col := 32*th + 8*n + 2*t4
					va, vb := slk[col] >= 0, slk[col+1] >= 0
					x := acc[tw][4*n : 4*n+4]
					s[tid][4*n], s[tid][4*n+1], s[tid][4*n+2], s[tid][4*n+3] = ninf, ninf, ninf, ninf
					if va {
						s[tid][4*n], s[tid][4*n+2] = x[0]*f0, x[2]*f1
					}
					if vb {
						s[tid][4*n+1], s[tid][4*n+3] = x[1]*f0, x[3]*f1
					}
				}
			}
			for hg := range 4 {
				for g := range 8 {
					mx0, mx1 := ninf, ninf
					for t4 := range 4 {
						x := s[128*th+32*hg+4*g+t4]
						for n := range 4 {
							mx0 = max(mx0, x[4*n], x[4*n+1])
							mx1 = max(mx1, x[4*n+2], x[4*n+3])
						}
					}
					m.setF(wgOffRedm+4*(th*64+16*hg+g), mx0)
					m.setF(wgOffRedm+4*(th*64+16*hg+g+8), mx1)
				}
			}
		}
		// Softmax and P (2 halves at MWG_OFF(hr, col), col even).
		for tid := range 256 {
			th, hg, l := tid>>7, (tid>>5)&3, tid&31
			g, t4 := l/4, l%4
			hr := [2]int{16*hg + g, 16*hg + g + 8}
			ms := [2]*float32{&m0[tid], &m1[tid]}
			ls := [2]*float32{&l0[tid], &l1[tid]}
			for r := range 2 {
				nm := max(*ms[r], m.f(wgOffRedm+4*hr[r]), m.f(wgOffRedm+4*(64+hr[r])))
				al := float32(1)
				if nm != ninf {
					al = float32(math.Exp2(float64(*ms[r] - nm)))
				}
				var sum float32
				for n := range 4 {
					col := 32*th + 8*n + 2*t4
					for e := range 2 {
						p := float32(0)
						if nm != ninf {
							p = float32(math.Exp2(float64(s[tid][4*n+2*r+e] - nm)))
						}
						sum += p
						m.setH(wgOffPs+mwgOff(hr[r], col)+2*e, h1Bits(h1Round(float64(p))))
					}
				}
				*ls[r] = *ls[r]*al + sum
				*ms[r] = nm
				if th == 0 && t4 == 0 {
					m.setF(wgOffAlph+4*hr[r], al)
				}
			}
		}
		// O x alpha, then P.V per warpgroup.
		for tid := range 256 {
			hg, g := (tid>>5)&3, (tid&31)/4
			a0, a1 := m.f(wgOffAlph+4*(16*hg+g)), m.f(wgOffAlph+4*(16*hg+g+8))
			for i := range 32 {
				o[tid][4*i] *= a0
				o[tid][4*i+1] *= a0
				o[tid][4*i+2] *= a1
				o[tid][4*i+3] *= a1
			}
		}
		for th := range 2 {
			for kk := range 4 {
				lbo, sbo := uint32(128), uint32(1024)
				if kn.pvSwap {
					lbo, sbo = sbo, lbo
				}
				m.wgMMA(t, o[128*th:128*th+128], 256, mwgDesc(uint32(wgOffPs+2048*kk), 1024, 128),
					mwgDesc(uint32(wgOffKt+32*th*8*128+256*kk), lbo, sbo), !kn.pvNoTr)
			}
		}
		sl[(k+2)%3] = nslot
	}
	// Row sums, lse, output.
	for tid := range 256 {
		if tid&3 != 0 {
			continue
		}
		th, hg, g := tid>>7, (tid>>5)&3, (tid&31)/4
		// The kernel's two xor-shuffles: (a+b)+(c+d).
		s0 := (l0[tid] + l0[tid+1]) + (l0[tid+2] + l0[tid+3])
		s1 := (l1[tid] + l1[tid+1]) + (l1[tid+2] + l1[tid+3])
		m.setF(wgOffLsum+4*(th*64+16*hg+g), s0)
		m.setF(wgOffLsum+4*(th*64+16*hg+g+8), s1)
	}
	if p := kn.part; p != nil {
		// mla_decode_wg2's split partials (the kernel's DEC block).
		for tid := range 256 {
			th, hg, l := tid>>7, (tid>>5)&3, tid&31
			g, t4 := l/4, l%4
			for hr := range 2 {
				hb := 16*hg + g + 8*hr
				h := h0 + hb
				if h >= c.H {
					continue
				}
				pz := (qi*c.H+h)*p.n + p.x
				for i := range 32 {
					col := 256*th + 8*i + 2*t4
					p.o[pz*512+col], p.o[pz*512+col+1] = o[tid][4*i+2*hr], o[tid][4*i+2*hr+1]
				}
				if th == 0 && t4 == 0 {
					mm := m0[tid]
					if hr == 1 {
						mm = m1[tid]
					}
					if mm != ninf && p.bad != 1 {
						mm *= 0.6931471805599453
					}
					p.ml[2*pz], p.ml[2*pz+1] = mm, m.f(wgOffLsum+4*hb)+m.f(wgOffLsum+4*(64+hb))
				}
			}
		}
		return
	}
	for tid := range 128 {
		if tid&3 != 0 {
			continue
		}
		hg, g := tid>>5, (tid&31)/4
		for r := range 2 {
			hb := 16*hg + g + 8*r
			h := h0 + hb
			l := m.f(wgOffLsum+4*hb) + m.f(wgOffLsum+4*(64+hb))
			mm := m0[tid]
			if r == 1 {
				mm = m1[tid]
			}
			if h < c.H {
				v := ninf
				if l > 0 {
					v = mm*0.6931471805599453 + float32(math.Log(float64(l)))
				}
				lse[qi*c.H+h] = v
			}
		}
	}
	for tid := range 256 {
		th, hg, l := tid>>7, (tid>>5)&3, tid&31
		g, t4 := l/4, l%4
		if kn.outCols {
			th = 1 - th
		}
		for hr := range 2 {
			hb := 16*hg + g + 8*hr
			h := h0 + hb
			if h >= c.H {
				continue
			}
			ls := m.f(wgOffLsum+4*hb) + m.f(wgOffLsum+4*(64+hb))
			inv := float32(0)
			if ls > 0 {
				inv = 1 / ls
			}
			for i := range 32 {
				col := 256*th + 8*i + 2*t4
				out[(qi*c.H+h)*512+col] = o[tid][4*i+2*hr] * inv
				out[(qi*c.H+h)*512+col+1] = o[tid][4*i+2*hr+1] * inv
			}
		}
	}
}

// TestMLAPrefillWGTranscribed: the transcription passes mla_prefill_h1's
// bounds (the GPU check's) on its inputs, and each planted mistake (a
// dropped entry; wrong descriptor strides, transpose flag, token half or
// output columns) fails them.
func TestMLAPrefillWGTranscribed(t *testing.T) {
	src := WGKernelSource()
	for _, l := range wgSourceLines {
		if !strings.Contains(src, l) {
			t.Errorf("transcribed line no longer in cu/wg/mla_prefill_wg.cu: %s", l)
		}
	}
	if wgOffLsum+2*64*4+3*64*4 != MLAPrefillWGSmemBytes || MLAPrefillWGSmemBytes != 199936 {
		t.Errorf("shared memory: offsets end at %d, MLAPrefillWGSmemBytes %d, MWG_SMEM_BYTES 199936", wgOffLsum+2*64*4+3*64*4, MLAPrefillWGSmemBytes)
	}
	r := rand.New(rand.NewPCG(13, 9))
	for _, cs := range []struct{ nq, H, nidx, ldIdx int }{{4, 72, 150, 160}, {3, 4, 32, 32}, {2, 128, 300, 304}} {
		c := newH1Case(r, cs.nq, cs.H, cs.nidx, cs.ldIdx, 0.1)
		out, lse := wgTranscribe(t, c, wgKnobs{})
		we, wh, wl, rel := c.check(out, lse)
		t.Logf("nq=%d H=%d nidx=%d: |d|/bound exact %.3g, emulated %.3g, lse %.3g; max|d|/max|v| %.3g", cs.nq, cs.H, cs.nidx, we, wh, wl, rel)
		if !(we <= 1 && wh <= 1 && wl <= 1) {
			t.Errorf("nq=%d H=%d: transcription outside the bounds: exact %g emulated %g lse %g", cs.nq, cs.H, we, wh, wl)
		}
		// Against mla_prefill_h1's transcription: the same function, float32
		// sums in another order.
		ho, hl := h1Transcribe(c)
		var dmax, vmax float64
		for i := range ho {
			dmax = max(dmax, math.Abs(float64(ho[i]-out[i])))
			vmax = max(vmax, math.Abs(float64(ho[i])))
		}
		t.Logf("vs mla_prefill_h1's transcription: max|d| %.3g of max|v| %.3g", dmax, vmax)
		if dmax > 1e-4*vmax {
			t.Errorf("nq=%d H=%d: wg and h1 transcriptions differ by %g (max|v| %g)", cs.nq, cs.H, dmax, vmax)
		}
		_ = hl
		if cs.H != 72 {
			continue
		}
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
		out2, lse2 := wgTranscribe(t, &bad, wgKnobs{})
		if _, wh2, _, _ := c.check(out2, lse2); wh2 <= 1 {
			t.Errorf("one entry dropped per row passes the emulated bound (%g)", wh2)
		} else {
			t.Logf("one entry dropped per row: emulated |d|/bound %.3g", wh2)
		}
		for name, kn := range map[string]wgKnobs{
			"P.V B descriptor LBO/SBO swapped": {pvSwap: true},
			"P.V B read K-major":               {pvNoTr: true},
			"QK^T B at the other token half":   {qkHalf: true},
			"output column halves swapped":     {outCols: true},
		} {
			o3, l3 := wgTranscribe(t, c, kn)
			if _, wh3, _, _ := c.check(o3, l3); wh3 <= 1 {
				t.Errorf("planted mistake %q passes the emulated bound (%g)", name, wh3)
			} else {
				t.Logf("planted mistake %q: emulated |d|/bound %.3g", name, wh3)
			}
		}
	}
}
