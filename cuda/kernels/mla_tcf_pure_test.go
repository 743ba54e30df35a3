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
