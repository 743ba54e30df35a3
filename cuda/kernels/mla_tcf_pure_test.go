package kernels

import (
	"math"
	"math/rand/v2"
	"testing"
)

// mla_decode_tcf's fragment mapping replayed on the CPU (no GPU: CI): one
// warp (latent group w) of one 32-token tile, each lane's registers built
// as the kernel builds them (permuted k for the scores, ldmatrix.trans +
// byte permute for P.V, the output columns stored back in order), the
// mma.sync m16n8k16 fragment layouts applied, and every score and output
// compared in float64 with the plain sums. The fp16 splits and scalings are
// exact rewrites of the values; the device checks cover them.

// mmaF64 is one m16n8k16 mma on per-lane fragments (a[lane][reg][half],
// b[lane][reg][half], c[lane][reg]) with PTX's layouts for 16-bit A (row),
// B (col) and f32 C.
func mmaF64(a *[32][4][2]float64, b *[32][2][2]float64, c *[32][4]float64) {
	var am [16][16]float64
	var bm [16][8]float64
	for l := range 32 {
		g, t := l/4, l%4
		for r := range 4 {
			row, k := g+8*(r&1), 2*t+8*(r>>1)
			am[row][k], am[row][k+1] = a[l][r][0], a[l][r][1]
		}
		for r := range 2 {
			k := 2*t + 8*r
			bm[k][g], bm[k+1][g] = b[l][r][0], b[l][r][1]
		}
	}
	for l := range 32 {
		g, t := l/4, l%4
		for e := range 4 {
			row, col := g+8*(e>>1), 2*t+(e&1)
			for k := range 16 {
				c[l][e] += am[row][k] * bm[k][col]
			}
		}
	}
}

func TestMLATCFLayout(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 11))
	const TT, TB = 32, MLATokenBytes
	raw := make([]byte, TT*TB)
	for i := range raw {
		raw[i] = byte(r.IntN(256))
		if raw[i]&0x7f == 0x7f {
			raw[i] = 0 // no NaN
		}
	}
	for tok := range TT {
		for i := range 64 {
			u := bf16Round(float32(r.NormFloat64()))
			raw[tok*TB+528+2*i], raw[tok*TB+529+2*i] = byte(u), byte(u>>8)
		}
	}
	dec := func(b byte) float64 { return fp8Table[b] }
	rope := func(tok, i int) float64 {
		return bf16ToF64(uint16(raw[tok*TB+528+2*i]) | uint16(raw[tok*TB+529+2*i])<<8)
	}
	var q [16][576]float64
	var P [16][TT]float64
	for h := range 16 {
		for d := range 576 {
			q[h][d] = r.NormFloat64()
		}
		for j := range TT {
			P[h][j] = r.Float64()
		}
	}
	worstS, worstO := 0.0, 0.0
	for w := range 4 {
		// Scores: latent k-steps then the RoPE k-step, as mtf_body.
		var s [4][32][4]float64
		for ks := range 9 {
			var a [32][4][2]float64
			for l := range 32 {
				g, t4 := l/4, l%4
				for rr := range 4 {
					h := g + 8*(rr&1)
					d := 128*w + 16*ks + 4*t4 + 2*(rr>>1)
					if ks == 8 {
						d = 512 + 16*w + 4*t4 + 2*(rr>>1)
					}
					a[l][rr] = [2]float64{q[h][d], q[h][d+1]}
				}
			}
			for n := range 4 {
				var b [32][2][2]float64
				for l := range 32 {
					g, t4 := l/4, l%4
					tok := 8*n + g
					if ks < 8 {
						x := raw[tok*TB+128*w+16*ks+4*t4:]
						b[l][0] = [2]float64{dec(x[0]), dec(x[1])}
						b[l][1] = [2]float64{dec(x[2]), dec(x[3])}
					} else {
						// uint2 at 528 + 32w + 8t4: bf16 dims 16w + 4t4 .. +3.
						i := 16*w + 4*t4
						b[l][0] = [2]float64{rope(tok, i), rope(tok, i+1)}
						b[l][1] = [2]float64{rope(tok, i+2), rope(tok, i+3)}
					}
				}
				mmaF64(&a, &b, &s[n])
			}
		}
		for l := range 32 {
			g, t4 := l/4, l%4
			for n := range 4 {
				for e := range 4 {
					h, tok := g+8*(e>>1), 8*n+2*t4+(e&1)
					var want float64
					for d := 128 * w; d < 128*w+128; d++ {
						want += q[h][d] * dec(raw[tok*TB+d])
					}
					for i := 16 * w; i < 16*w+16; i++ {
						want += q[h][512+i] * rope(tok, i)
					}
					worstS = math.Max(worstS, math.Abs(s[n][l][e]-want))
				}
			}
		}
		// P.V: ldmatrix.trans over the raw rows, byte permute 0x3120, the
		// even / odd column n-tiles of each 16-byte chunk.
		var o [16][32][4]float64
		for kk := range 2 {
			var a [32][4][2]float64
			for l := range 32 {
				g, t4 := l/4, l%4
				for rr := range 4 {
					h, tok := g+8*(rr&1), 16*kk+2*t4+8*(rr>>1)
					a[l][rr] = [2]float64{P[h][tok], P[h][tok+1]}
				}
			}
			for cp := range 4 {
				// Lane l's row address: matrix l/8, row l%8.
				var rowTok, rowOff [32]int
				for l := range 32 {
					mi := l >> 3
					rowTok[l] = 16*kk + 8*(mi&1) + (l & 7)
					rowOff[l] = 128*w + 16*(mi>>1) + 32*cp
				}
				var reg [32][4]uint32
				for l := range 32 {
					g, t4 := l/4, l%4
					for mi := range 4 {
						lo, hi := 8*mi+2*t4, 8*mi+2*t4+1 // rows 2t4, 2t4+1 of matrix mi
						bt := func(row, j int) uint32 { return uint32(raw[rowTok[row]*TB+rowOff[row]+j]) }
						reg[l][mi] = bt(lo, 2*g) | bt(lo, 2*g+1)<<8 | bt(hi, 2*g)<<16 | bt(hi, 2*g+1)<<24
					}
				}
				perm := func(x uint32) uint32 { // __byte_perm(x, 0, 0x3120)
					return x&0xff | (x>>16&0xff)<<8 | (x>>8&0xff)<<16 | (x>>24)<<24
				}
				h2 := func(x uint32) [2]float64 { return [2]float64{dec(byte(x)), dec(byte(x >> 8))} }
				for par := range 2 {
					for half := range 2 { // chunk 2cp + half
						var b [32][2][2]float64
						for l := range 32 {
							y0, y1 := perm(reg[l][2*half]), perm(reg[l][2*half+1])
							b[l][0], b[l][1] = h2(y0>>(16*par)), h2(y1>>(16*par))
						}
						mmaF64(&a, &b, &o[4*cp+2*half+par])
					}
				}
			}
		}
		for l := range 32 {
			g, t4 := l/4, l%4
			for hr := range 2 {
				h := g + 8*hr
				for cc := range 8 {
					col := 128*w + 16*cc + 4*t4
					got := [4]float64{o[2*cc][l][2*hr], o[2*cc+1][l][2*hr], o[2*cc][l][2*hr+1], o[2*cc+1][l][2*hr+1]}
					for i, v := range got {
						var want float64
						for tok := range TT {
							want += P[h][tok] * dec(raw[tok*TB+col+i])
						}
						worstO = math.Max(worstO, math.Abs(v-want))
					}
				}
			}
		}
	}
	if worstS > 1e-9 || worstO > 1e-9 {
		t.Fatalf("fragment mapping: scores off by %g, outputs by %g", worstS, worstO)
	}
}

// f16RoundT rounds v to the nearest fp16 (ties to even, subnormals kept;
// the kernels' cvt.rn.f16x2.f32).
func f16RoundT(v float32) float32 {
	a := math.Abs(float64(v))
	if a == 0 {
		return v
	}
	q := math.Ldexp(1, -24)
	if a >= math.Ldexp(1, -14) {
		q = math.Ldexp(1, math.Ilogb(a)-10)
	}
	return float32(math.RoundToEven(float64(v)/q) * q)
}

// splitH is mtf_splith: np fp16 parts, each the rounding of what the
// previous leave (float32 arithmetic, as on the device).
func splitH(v float32, np int) []float32 {
	p := make([]float32, np)
	for i := range p {
		p[i] = f16RoundT(v)
		v -= p[i]
	}
	return p
}

// TestMLATCFArithmetic transcribes mla_decode_tcf's value arithmetic (not
// its fragments: TestMLATCFLayout) in Go: the queries of each (head,
// latent group) scaled by 2^e into [2^14, 2^15) and split in fp16 parts,
// the partial scores scaled back and by the group scale, the RoPE part
// added, the online softmax over 32-token tiles with the P.V exponent E
// (a running max of the group scales, o rescaled when it grows),
// P x scale x 2^(14-E) in fp16 parts, the output scaled by 2^(E-14) / l;
// against float64 over cache rows whose group scales span 2^-20..2^6 (E
// grows across tiles). Three parts: float32-level; two parts: ~2^-22.
func TestMLATCFArithmetic(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 5))
	const H, T, TB = 16, 96, MLATokenBytes
	rows := randFP8(r, T*TB)
	for tok := range T {
		for g := range 4 {
			putF32(rows[tok*TB+512+4*g:], float32(math.Ldexp(0.5+r.Float64(), -20+r.IntN(27)*tok/T)))
		}
		for i := range 64 {
			u := bf16Round(float32(r.NormFloat64()))
			rows[tok*TB+528+2*i], rows[tok*TB+529+2*i] = byte(u), byte(u>>8)
		}
	}
	scl := func(tok, g int) float32 { return getF32(rows[tok*TB+512+4*g:]) }
	raw := func(tok, d int) float64 { return fp8Table[rows[tok*TB+d]] }
	rope := func(tok, i int) float64 {
		return bf16ToF64(uint16(rows[tok*TB+528+2*i]) | uint16(rows[tok*TB+529+2*i])<<8)
	}
	q := make([][]float32, H)
	for h := range q {
		q[h] = make([]float32, 576)
		mag := math.Ldexp(1, r.IntN(12)-6)
		for d := range q[h] {
			q[h][d] = float32(r.NormFloat64() * mag)
		}
	}
	const scale = 0.05
	for _, np := range []int{3, 2} {
		var worst float64
		for h := range H {
			// Reference in float64.
			sc := make([]float64, T)
			mx := math.Inf(-1)
			for tok := range T {
				var d float64
				for i := range 512 {
					d += float64(q[h][i]) * raw(tok, i) * float64(scl(tok, i/128))
				}
				for i := range 64 {
					d += float64(q[h][512+i]) * rope(tok, i)
				}
				sc[tok] = d * scale
				mx = math.Max(mx, sc[tok])
			}
			want := make([]float64, 512)
			var l float64
			for tok := range T {
				p := math.Exp(sc[tok] - mx)
				l += p
				for i := range 512 {
					want[i] += p * raw(tok, i) * float64(scl(tok, i/128))
				}
			}
			var maxC float64
			for i := range want {
				want[i] /= l
				maxC = math.Max(maxC, math.Abs(want[i]))
			}
			// The kernel's arithmetic: per group w, split queries.
			var qs [4][]float32
			var ie [4]float32
			for w := range 4 {
				var m float32
				for i := 128 * w; i < 128*w+128; i++ {
					m = float32(math.Max(float64(m), math.Abs(float64(q[h][i]))))
				}
				e := 0
				if m > 0 {
					e = max(-126, min(126, 14-(math.Ilogb(float64(m)))))
				}
				f := float32(math.Ldexp(1, e))
				ie[w] = float32(math.Ldexp(1, -e))
				qs[w] = make([]float32, 128*np)
				for i := range 128 {
					copy(qs[w][i*np:], splitH(q[h][128*w+i]*f, np))
				}
			}
			o := make([]float64, 512)
			m0, l0 := math.Inf(-1), 0.0
			E := [4]int{-126, -126, -126, -126}
			for t0 := 0; t0 < T; t0 += 32 {
				s := make([]float64, 32)
				for j := range 32 {
					tok := t0 + j
					var tot float32
					for w := range 4 {
						var part float64 // the tensor cores' f32 sum (float64 here: far inside the bound)
						for i := range 128 {
							for p := range np {
								part += float64(qs[w][i*np+p]) * raw(tok, 128*w+i)
							}
						}
						v := float32(part) * ie[w] * scl(tok, w)
						var rp float64
						for i := 16 * w; i < 16*w+16; i++ {
							rp += float64(q[h][512+i]) * rope(tok, i)
						}
						tot += v + float32(rp)
					}
					s[j] = float64(tot * scale)
				}
				nm := m0
				for _, v := range s {
					nm = math.Max(nm, v)
				}
				c := math.Exp(m0 - nm)
				if math.IsInf(m0, -1) {
					c = 1
				}
				l0 *= c
				for i := range o {
					o[i] *= c
				}
				for w := range 4 {
					var smax float32
					for j := range 32 {
						smax = float32(math.Max(float64(smax), float64(scl(t0+j, w))))
					}
					et := math.Ilogb(float64(smax)) + 1
					if et > E[w] {
						rr := math.Ldexp(1, max(-126, E[w]-et))
						for i := 128 * w; i < 128*w+128; i++ {
							o[i] *= rr
						}
						E[w] = min(et, 140)
					}
				}
				for j := range 32 {
					p := float32(math.Exp(s[j] - nm))
					l0 += float64(p)
					for w := range 4 {
						fe := float32(math.Ldexp(1, max(-126, min(127, 14-E[w]))))
						pp := splitH(p*(scl(t0+j, w)*fe), np)
						for i := 128 * w; i < 128*w+128; i++ {
							for _, v := range pp {
								o[i] += float64(v) * raw(t0+j, i)
							}
						}
					}
				}
				m0 = nm
			}
			for i := range o {
				got := o[i] * math.Ldexp(1, max(-126, min(127, E[i/128]-14))) / l0
				worst = math.Max(worst, math.Abs(got-want[i])/maxC)
			}
		}
		bound := 1e-6
		if np == 2 {
			bound = 1e-5
		}
		t.Logf("%d fp16 parts: max|d|/max|ref| = %.3g (bound %.g)", np, worst, bound)
		if !(worst <= bound) {
			t.Errorf("%d fp16 parts: max|d|/max|ref| = %.3g, bound %.g", np, worst, bound)
		}
	}
}
