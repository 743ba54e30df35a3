package kernels

import (
	"math"
	"math/rand/v2"
	"testing"
)

// TestAbsorbP1Transcribed replays absorb_p1 (gemm_p1_absorb.cu) thread by
// thread on the host, without a GPU: the A loader (a warp 8 rows, a lane 4
// values, the row maximum across the warp, fp16 stores at 4 lane), both B
// loaders (v mode's [n][k] bytes, q mode's [k][n] fp16 rows), the fragment
// loads with the PTX semantics of ldmatrix.x4 / .trans (lanes 8i..8i+7
// address matrix i's rows; without .trans lane t gets row t/4, columns
// 2 (t%4) + {0,1}; with it row 2 (t%4) + {0,1}, column t/4) and of
// cvt.rn.f16x2.e4m3x2 (low byte to the low half), mma m16n8k16's fragment
// layout (a0..a3, b0/b1, c0..c3), the promotion and the output mapping; it
// checks that every A / B element a fragment slot names is the one the mma
// needs (each is reconstructed from the lanes and must be consistent), and
// the outputs against the float64 products within the one-part bound, on
// shapes with row, column and K tails. A wrong lane address, fragment
// index or layout lands far outside (the bound fails by orders).
func TestAbsorbP1Transcribed(t *testing.T) {
	r := rand.New(rand.NewPCG(21, 22))
	const R = 256
	rb := R / 128
	for _, sh := range []struct{ M, H, nope, vd, hs int }{{70, 2, 192, 48, 200}, {40, 1, 128, 128, 128}, {5, 2, 64, 160, 70}} {
		M, H, nope, vd, hs := sh.M, sh.H, sh.nope, sh.vd, sh.hs
		ldq := H * hs
		q := randF32(r, M*ldq, 1)
		uk, uks := randFP8(r, H*nope*R), make([]float32, H*nope*rb)
		for i := range uks {
			uks[i] = float32(0.001 + 0.01*r.Float64())
		}
		x := randF32(r, M*H*R, 1)
		uv, uvs := randFP8(r, H*vd*R), make([]float32, H*vd*rb)
		for i := range uvs {
			uvs[i] = float32(0.001 + 0.01*r.Float64())
		}
		for mode := 0; mode < 2; mode++ {
			var got []float32
			var ref, abs []float64
			var rows, N, ldy int
			if mode == 0 {
				rows, N, ldy = M*H, R, R
				got = simAbsorbP1(t, 0, q, uk, uks, M, H, nope, 1, R, ldq, hs, 0)
				ref, abs = make([]float64, M*H*R), make([]float64, M*H*R)
				for m := range M {
					for h := range H {
						for c := range R {
							for d := range nope {
								p := fp8Table[uk[(h*nope+d)*R+c]] * float64(uks[(h*nope+d)*rb+c/128]) * float64(q[m*ldq+h*hs+d])
								ref[(m*H+h)*R+c] += p
								abs[(m*H+h)*R+c] += math.Abs(p)
							}
						}
					}
				}
			} else {
				ldo := H*vd + 1
				rows, N, ldy = M, H*vd, ldo
				got = simAbsorbP1(t, 1, x, uv, uvs, M, H, R, vd, R, 0, 0, ldo)
				ref, abs = make([]float64, M*ldo), make([]float64, M*ldo)
				for m := range M {
					for h := range H {
						for v := range vd {
							for c := range R {
								p := fp8Table[uv[(h*vd+v)*R+c]] * float64(uvs[(h*vd+v)*rb+c/128]) * float64(x[(m*H+h)*R+c])
								ref[m*ldo+h*vd+v] += p
								abs[m*ldo+h*vd+v] += math.Abs(p)
							}
						}
					}
				}
			}
			e := onePartErr(got, ref, abs, rows, N, ldy, uF16)
			t.Logf("mode %d M=%d H=%d nope=%d vd=%d: %.3g of the one-part bound", mode, M, H, nope, vd, e)
			if e > 1 {
				t.Errorf("mode %d M=%d H=%d nope=%d vd=%d: the replayed kernel at %.3g of the one-part bound", mode, M, H, nope, vd, e)
			}
		}
	}
}

// simAbsorbP1 replays absorb_p1 for every block of the grid; out has the
// kernel's layout (q mode [M][H][R], v mode rows of ldo), NaN where the
// kernel writes nothing.
func simAbsorbP1(t *testing.T, mode int, x []float32, W []byte, S []float32, M, H, K, N, R, ldx, hs, ldo int) []float32 {
	const BM, ALD, BLD, BHLD = 64, 136, 144, 136
	Nout, size := R, M*H*R
	if mode == 1 {
		Nout, size = N, M*ldo
	}
	out := make([]float32, size)
	for i := range out {
		out[i] = float32(math.NaN())
	}
	KBR := (R + 127) / 128
	f16 := func(v float32) float64 { return f16RoundTest(float64(v)) }
	for bz := 0; bz < (M+BM-1)/BM; bz++ {
		for h := 0; h < H; h++ {
			for bx := 0; bx < (Nout+127)/128; bx++ {
				n0, m0 := bx*128, bz*BM
				rows := min(BM, M-m0)
				cb := n0 >> 7
				var acc [8][32][2][4][4]float64 // [warp][lane][i][j][c]
				As := make([]float64, BM*ALD)   // halves
				Bb := make([]byte, 128*BLD)     // v mode bytes
				Bh := make([]float64, 128*BHLD) // q mode halves
				inv := make([]float64, BM)
				for k0 := 0; k0 < K; k0 += 128 {
					// A
					for warp := range 8 {
						var v [32][8][4]float32
						var mx [8]float32
						for lane := range 32 {
							kq := k0 + 4*lane
							sk := [4]float32{1, 1, 1, 1}
							if mode == 0 {
								for j := range 4 {
									sk[j] = 0
									if kq+j < K {
										sk[j] = S[(h*K+kq+j)*KBR+cb]
									}
								}
							}
							for i := range 8 {
								rr := warp*8 + i
								m := m0 + rr
								for j := range 4 {
									var a float32
									if rr < rows && kq+j < K {
										if mode == 0 {
											a = x[m*ldx+h*hs+kq+j]
										} else {
											a = x[(m*H+h)*K+kq+j]
										}
									}
									if mode == 0 {
										a *= sk[j]
									}
									v[lane][i][j] = a
									mx[i] = max(mx[i], float32(math.Abs(float64(a))))
								}
							}
						}
						for i := range 8 {
							rr := warp*8 + i
							e := 15
							if mx[i] > 0 {
								_, e = math.Frexp(float64(mx[i]))
								e = max(-100, min(100, e))
							}
							sc := float32(math.Ldexp(1, 15-e))
							inv[rr] = math.Ldexp(1, e-15)
							for lane := range 32 {
								for j := range 4 {
									As[rr*ALD+4*lane+j] = f16(v[lane][i][j] * sc)
								}
							}
						}
					}
					// B
					for tid := range 256 {
						if mode == 0 {
							for i := range 4 {
								c := tid + 256*i
								k, nn := c>>3, (c&7)*16
								for b := range 16 {
									var w byte
									if k0+k < K {
										w = W[(h*K+k0+k)*R+n0+nn+b]
									}
									Bh[k*BHLD+nn+b] = fp8Table[w] // byte b -> half b (cvt: low byte low half)
								}
							}
						} else {
							n, kq := tid>>1, (tid&1)*64
							for c := range 4 {
								for b := range 16 {
									var w byte
									if n0+n < N && k0+kq+16*c < K {
										w = W[(h*N+n0+n)*R+k0+kq+16*c+b]
									}
									Bb[n*BLD+kq+16*c+b] = w
								}
							}
						}
					}
					// mma
					for warp := range 8 {
						wm, wn := warp>>2, warp&3
						var part [32][2][4][4]float64
						for kk := 0; kk < 128; kk += 16 {
							// B fragments: bf[lane][j][0/1] = two values (low, high)
							var bf [32][4][2][2]float64
							if mode == 0 {
								for jp := range 2 {
									var addr [32]int
									for lane := range 32 {
										btk, btn := (lane&7)+((lane>>3)&1)*8, (lane>>4)*8
										addr[lane] = (kk+btk)*BHLD + wn*32 + jp*16 + btn
									}
									for lane := range 32 {
										for mi := range 4 {
											jj := 2*jp + mi>>1
											hb := mi & 1
											for e := range 2 { // trans: row 2 (t%4) + e, column t/4
												bf[lane][jj][hb][e] = Bh[addr[8*mi+2*(lane&3)+e]+lane>>2]
											}
										}
									}
								}
							} else {
								for lane := range 32 {
									g, t4 := lane>>2, lane&3
									for j := range 4 {
										base := (wn*32+j*8+g)*BLD + kk + 2*t4
										for e := range 2 {
											bf[lane][j][0][e] = fp8Table[Bb[base+e]]
											bf[lane][j][1][e] = fp8Table[Bb[base+8+e]]
										}
									}
								}
							}
							for i := range 2 {
								var af [32][4][2]float64
								var addr [32]int
								for lane := range 32 {
									aRow, aCol := lane&15, (lane>>4)*8
									addr[lane] = (wm*32+i*16+aRow)*ALD + kk + aCol
								}
								for lane := range 32 {
									for mi := range 4 { // non-trans: row t/4, columns 2 (t%4) + e
										for e := range 2 {
											af[lane][mi][e] = As[addr[8*mi+lane>>2]+2*(lane&3)+e]
										}
									}
								}
								for j := range 4 {
									// Rebuild A (16x16) and B (16x8) from the fragments, each slot once.
									var Am [16][16]float64
									var Bm [16][8]float64
									var aSet [16][16]bool
									var bSet [16][8]bool
									setA := func(rr, c int, v float64) {
										if aSet[rr][c] && Am[rr][c] != v {
											t.Fatalf("A[%d][%d] inconsistent across lanes", rr, c)
										}
										Am[rr][c], aSet[rr][c] = v, true
									}
									setB := func(k, n int, v float64) {
										if bSet[k][n] && Bm[k][n] != v {
											t.Fatalf("B[%d][%d] inconsistent across lanes", k, n)
										}
										Bm[k][n], bSet[k][n] = v, true
									}
									for lane := range 32 {
										g, t4 := lane>>2, lane&3
										for e := range 2 {
											setA(g, 2*t4+e, af[lane][0][e])
											setA(g+8, 2*t4+e, af[lane][1][e])
											setA(g, 2*t4+8+e, af[lane][2][e])
											setA(g+8, 2*t4+8+e, af[lane][3][e])
											setB(2*t4+e, g, bf[lane][j][0][e])
											setB(2*t4+8+e, g, bf[lane][j][1][e])
										}
									}
									// What the mma must see: A rows wm*32+i*16.., k kk..; B k kk.., n wn*32+j*8...
									for rr := range 16 {
										for c := range 16 {
											if want := As[(wm*32+i*16+rr)*ALD+kk+c]; Am[rr][c] != want {
												t.Fatalf("A fragment (%d,%d) holds %g, want %g", rr, c, Am[rr][c], want)
											}
										}
									}
									for k := range 16 {
										for n := range 8 {
											var want float64
											if mode == 0 {
												want = Bh[(kk+k)*BHLD+wn*32+j*8+n]
											} else {
												want = fp8Table[Bb[(wn*32+j*8+n)*BLD+kk+k]]
											}
											if Bm[k][n] != want {
												t.Fatalf("mode %d B fragment (%d,%d) holds %g, want %g", mode, k, n, Bm[k][n], want)
											}
										}
									}
									for lane := range 32 {
										g, t4 := lane>>2, lane&3
										for c := range 4 {
											rr, col := g+8*(c>>1), 2*t4+c&1
											for k := range 16 {
												part[lane][i][j][c] += Am[rr][k] * Bm[k][col]
											}
										}
									}
								}
							}
						}
						// promote
						for lane := range 32 {
							g, t4 := lane>>2, lane&3
							for i := range 2 {
								ia, ib := inv[wm*32+i*16+g], inv[wm*32+i*16+g+8]
								for j := range 4 {
									s0, s1 := 1.0, 1.0
									if mode != 0 {
										n := n0 + wn*32 + j*8 + 2*t4
										s0, s1 = 0, 0
										if n < N {
											s0 = float64(S[(h*N+n)*KBR+k0/128])
										}
										if n+1 < N {
											s1 = float64(S[(h*N+n+1)*KBR+k0/128])
										}
									}
									a := &acc[warp][lane][i][j]
									a[0] += part[lane][i][j][0] * ia * s0
									a[1] += part[lane][i][j][1] * ia * s1
									a[2] += part[lane][i][j][2] * ib * s0
									a[3] += part[lane][i][j][3] * ib * s1
								}
							}
						}
					}
				}
				// output
				for warp := range 8 {
					wm, wn := warp>>2, warp&3
					for lane := range 32 {
						g, t4 := lane>>2, lane&3
						for i := range 2 {
							for hh := range 2 {
								rr := wm*32 + i*16 + g + hh*8
								if rr >= rows {
									continue
								}
								m := m0 + rr
								for j := range 4 {
									n := n0 + wn*32 + j*8 + 2*t4
									for e := range 2 {
										if n+e >= Nout {
											continue
										}
										o := acc[warp][lane][i][j][2*hh+e]
										if mode == 0 {
											out[(m*H+h)*R+n+e] = float32(o)
										} else {
											out[m*ldo+h*N+n+e] = float32(o)
										}
									}
								}
							}
						}
					}
				}
			}
		}
	}
	return out
}
