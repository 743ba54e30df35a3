package kernels

import (
	"math"
	"math/rand/v2"
	"strings"
	"testing"
)

// mmaSim is mma.sync m16n8k16's fragment layout (PTX ISA): lane = 4g + t;
// A regs 0..3 hold (row g, k 2t..2t+1), (g+8, 2t..), (g, 2t+8..), (g+8,
// 2t+8..); B regs 0..1 (k 2t..2t+1, col g), (k 2t+8.., col g); C
// (g, 2t..2t+1), (g+8, 2t..2t+1). Values as float64 pairs.
func mmaSim(c *[32][4]float64, a *[32][4][2]float64, b *[32][2][2]float64) {
	var A [16][16]float64
	var B [16][8]float64
	for l := range 32 {
		g, t := l/4, l%4
		for r := range 4 {
			row, col := g+8*(r&1), 2*t+8*(r>>1)
			A[row][col], A[row][col+1] = a[l][r][0], a[l][r][1]
		}
		for r := range 2 {
			k := 2*t + 8*r
			B[k][g], B[k+1][g] = b[l][r][0], b[l][r][1]
		}
	}
	for l := range 32 {
		g, t := l/4, l%4
		for i := range 4 {
			row, col := g+8*(i>>1), 2*t+(i&1)
			s := 0.0
			for k := range 16 {
				s += A[row][k] * B[k][col]
			}
			c[l][i] += s
		}
	}
}

// TestGemvMMALayout walks gemv_mma.cu's thread mapping (the permuted K
// order of weights and x, the fragments, the per-warp chunks and the final
// reduction) in float64 with a simulated mma.sync, so that a mapping error
// fails here, without a GPU. fp8 and bf16 chunk widths, paired and plain.
func TestGemvMMALayout(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 11))
	for _, cs := range []struct {
		E, RT, N, K, M int
		pair           bool
	}{{16, 2, 40, 1024, 3, true}, {8, 1, 20, 512, 8, false}, {16, 4, 70, 640, 5, false}, {16, 4, 24, 768, 2, true}, {8, 2, 33, 256, 1, false}, {16, 2, 50, 160, 4, true}, {8, 1, 17, 288, 7, false}} {
		E, RT, N, K, M := cs.E, cs.RT, cs.N, cs.K, cs.M
		w0 := make([]float64, N*K)
		w1 := make([]float64, N*K)
		x := make([]float64, M*K)
		for i := range w0 {
			w0[i], w1[i] = r.NormFloat64(), r.NormFloat64()
		}
		for i := range x {
			x[i] = r.NormFloat64()
		}
		tout := RT
		if cs.pair {
			tout = RT / 2
		}
		KE := K / E
		C := (KE + 3) / 4
		got := make([]float64, M*N)
		for blk := 0; blk*tout*16 < N; blk++ {
			n0 := blk * tout * 16
			var red [8][][32][4]float64
			for warp := range 8 {
				acc := make([][32][4]float64, RT)
				for c := warp; c < C; c += 8 {
					for rt := range RT {
						var part [32][4]float64
						for j := range E / 4 {
							var a [32][4][2]float64
							var b [32][2][2]float64
							for l := range 32 {
								g, tt := l/4, l%4
								up := cs.pair && rt >= tout
								nb := n0 + rt*16
								w := w0
								if up {
									nb, w = n0+(rt-tout)*16, w1
								}
								if c*4+tt >= KE {
									continue // short last chunk: zeros
								}
								for h := range 2 {
									n := min(nb+g+8*h, N-1)
									k := c*4*E + tt*E + 4*j
									// reg h (lo pair), h+2 (hi pair)
									a[l][h] = [2]float64{w[n*K+k], w[n*K+k+1]}
									a[l][h+2] = [2]float64{w[n*K+k+2], w[n*K+k+3]}
								}
								if g < M {
									k := c*4*E + tt*E + 4*j
									b[l][0] = [2]float64{x[g*K+k], x[g*K+k+1]}
									b[l][1] = [2]float64{x[g*K+k+2], x[g*K+k+3]}
								}
							}
							mmaSim(&part, &a, &b)
						}
						for l := range 32 {
							for i := range 4 {
								acc[rt][l][i] += part[l][i]
							}
						}
					}
				}
				red[warp] = acc
			}
			for o := 0; o < tout*16*M; o++ {
				m, rr := o%M, o/M
				rt, rw := rr>>4, rr&15
				ln, i := (rw&7)*4+(m>>1), (rw>>3)*2+(m&1)
				v, u := 0.0, 0.0
				for w := range 8 {
					v += red[w][rt][ln][i]
					if cs.pair {
						u += red[w][rt+tout][ln][i]
					}
				}
				if cs.pair {
					v = v / (1 + math.Exp(-v)) * u
				}
				if n := n0 + rr; n < N {
					got[m*N+n] = v
				}
			}
		}
		maxd, maxr := 0.0, 0.0
		for m := range M {
			for n := range N {
				dot := func(w []float64) float64 {
					s := 0.0
					for k := range K {
						s += w[n*K+k] * x[m*K+k]
					}
					return s
				}
				ref := dot(w0)
				if cs.pair {
					ref = ref / (1 + math.Exp(-ref)) * dot(w1)
				}
				maxd, maxr = max(maxd, math.Abs(got[m*N+n]-ref)), max(maxr, math.Abs(ref))
			}
		}
		if maxd > 1e-9*maxr {
			t.Errorf("%+v: max|d| %.3g of max|ref| %.3g", cs, maxd, maxr)
		}
	}
}

// TestGemvMMAChunkWalk replays gemv_mma_body's chunk loops (plain: U
// chunks a stage; _p: two stages in flight) for every warp and checks that
// each chunk of a row is multiplied exactly once.
func TestGemvMMAChunkWalk(t *testing.T) {
	const warps = 8
	for _, v := range mmaAllVariants() {
		for C := 1; C <= 70; C++ {
			seen := make([]int, C)
			for warp := range warps {
				step := warps * v.U
				run := func(c0 int) {
					for u := range v.U {
						if c := c0 + u*warps; c < C {
							seen[c]++
						}
					}
				}
				if v.P == 1 {
					for c0 := warp; c0 < C; c0 += 2 * step {
						run(c0)
						if c0+step >= C {
							break
						}
						run(c0 + step)
					}
				} else {
					for c0 := warp; c0 < C; c0 += step {
						for u := range v.U {
							c := c0 + u*warps
							if c >= C {
								break
							}
							seen[c]++
						}
					}
				}
			}
			for c, n := range seen {
				if n != 1 {
					t.Fatalf("%+v C=%d: chunk %d multiplied %d times", v, C, c, n)
				}
			}
		}
	}
}

// TestMMAVariantsDefined: the GEMV kernels gemv_mma.cu and gemv_mma_x.cu
// define are exactly the variants mmaCompiled knows, for fp8 and bf16 (no
// GPU needed): a pin or shape it accepts has its kernel, and no kernel is
// compiled that no variant names.
func TestMMAVariantsDefined(t *testing.T) {
	defined := map[string]bool{}
	for name := range kernelEntries(KernelSource()) {
		// The grouped launches (gemv_mmx_group_*, the grouped experts'
		// uniqueMMAKernel) have launchers of their own.
		if (strings.HasPrefix(name, "gemv_mma_") || strings.HasPrefix(name, "gemv_mmx_")) && !strings.HasPrefix(name, "gemv_mmx_group_") &&
			name != uniqueMMAKernel {
			defined[name] = true
		}
	}
	want := map[string]bool{}
	for _, v := range mmaAllVariants() {
		for _, bf16 := range []bool{false, true} {
			if mmaCompiled(v, bf16) {
				want[v.name(bf16)] = true
			}
		}
	}
	if len(want) != 8 {
		t.Errorf("%d compiled GEMV variants (fp8 and bf16), want 8: %v", len(want), want)
	}
	for n := range want {
		if !defined[n] {
			t.Errorf("variant %s is not defined in the kernel source", n)
		}
	}
	for n := range defined {
		if !want[n] {
			t.Errorf("kernel %s is defined but no variant names it", n)
		}
	}
}
