package kernels

import (
	"math/rand/v2"
	"testing"
)

// bytePerm is CUDA's __byte_perm(x, y, s) (selectors 0-7, no sign mode).
func bytePerm(x, y, s uint32) uint32 {
	b := uint64(x) | uint64(y)<<32
	var r uint32
	for i := range 4 {
		sel := (s >> (4 * i)) & 7
		r |= uint32(b>>(8*sel)&0xff) << (8 * i)
	}
	return r
}

// TestIndexerF8FragmentOrder transcribes indexer_scores_f8's operands (the
// A fragments re-paired from idx_q_prep's bytes by idx_f8_afrag, each
// lane's two 16-byte key loads split into words 2s, 2s+1) into the PTX
// m16n8k32 fragment layout and checks that the four k-steps' products sum
// to every (head, key) dot product over the 128 dimensions: the k
// permutation is the same for the query and the keys.
func TestIndexerF8FragmentOrder(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	const D = IndexerHeadDim
	var q [IndexerQHeads][D]int
	var key [16][D]byte // one group of 16 keys (two n-tiles)
	qh := make([]byte, IndexerQRowBytes)
	for h := range IndexerQHeads {
		for d := range D {
			v := r.IntN(256)
			q[h][d] = v - 128
			qh[IndexerQByte(h, d)] = byte(v - 128)
		}
	}
	for n := range 16 {
		for d := range D {
			key[n][d] = byte(r.IntN(256))
		}
	}
	word := func(b []byte) uint32 { return uint32(b[0]) | uint32(b[1])<<8 | uint32(b[2])<<16 | uint32(b[3])<<24 }
	var got [IndexerQHeads][16]int
	for mt := range 4 {
		for nt := range 2 {
			for s := range 4 {
				// The step's A [16][32] and B [32][8] from every lane's registers
				// by the PTX m16n8k32 layout (8-bit types): lane (g, c) holds A
				// row g, k 4c+i in reg 0 and 16+4c+i in reg 2 (rows g+8: regs 1,
				// 3), B column g, k 4c+i in reg 0 and 16+4c+i in reg 1.
				var A [16][32]int
				var B [32][8]int
				for lane := range 32 {
					g, c := lane>>2, lane&3
					// idx_f8_afrag(src, mt, s, lane)
					e0 := ((mt*8+2*s)*32 + lane) * 8
					e1 := ((mt*8+2*s+1)*32 + lane) * 8
					v0x, v0y := word(qh[e0:]), word(qh[e0+4:])
					v1x, v1y := word(qh[e1:]), word(qh[e1+4:])
					a := [4]uint32{bytePerm(v0x, v0y, 0x5410), bytePerm(v0x, v0y, 0x7632), bytePerm(v1x, v1y, 0x5410), bytePerm(v1x, v1y, 0x7632)}
					// The lane's key loads: dims 16c.. (words 0-3), 64+16c.. (4-7);
					// step s takes words 2s, 2s+1.
					kr := key[8*nt+g][:]
					var w [8]uint32
					for i := range 4 {
						w[i] = word(kr[16*c+4*i:])
						w[4+i] = word(kr[64+16*c+4*i:])
					}
					for i := range 4 {
						A[g][4*c+i] = int(int8(a[0] >> (8 * i)))
						A[g+8][4*c+i] = int(int8(a[1] >> (8 * i)))
						A[g][16+4*c+i] = int(int8(a[2] >> (8 * i)))
						A[g+8][16+4*c+i] = int(int8(a[3] >> (8 * i)))
						B[4*c+i][g] = int(uint8(w[2*s] >> (8 * i)))
						B[16+4*c+i][g] = int(uint8(w[2*s+1] >> (8 * i)))
					}
				}
				for m := range 16 {
					for n := range 8 {
						for k := range 32 {
							got[16*mt+m][8*nt+n] += A[m][k] * B[k][n]
						}
					}
				}
			}
		}
	}
	bad := 0
	for h := range IndexerQHeads {
		for n := range 16 {
			want := 0
			for d := range D {
				want += q[h][d] * int(key[n][d])
			}
			if got[h][n] != want {
				bad++
			}
		}
	}
	if bad != 0 {
		t.Fatalf("%d of %d (head, key) dot products differ: the query's and the keys' k orders disagree", bad, IndexerQHeads*16)
	}
}

// TestIndexerWGTranscription transcribes indexer_scores_wg's index
// arithmetic: the query prologue's two 2-byte reads per (head, 4
// dimensions) are IndexerQByte's bytes, WGI_OFF places every (row, byte)
// of a 64 x 128 matrix once, and the epilogue's shuffle reduce-scatter
// leaves each of a warp's 64 keys summed over the 8 lane groups exactly
// once.
func TestIndexerWGTranscription(t *testing.T) {
	for i := range IndexerQHeads * (IndexerHeadDim / 4) {
		h, d := i>>5, (i&31)*4
		mt, rr := h>>4, h&15
		hg, hi, dd := rr&7, rr>>3, d&63
		kst, cg := (d>>6)<<2+(dd&15)>>2, dd>>4
		e := ((mt*8+kst)*32 + hg*4 + cg) * 8
		for j, b := range []int{e + 2*hi, e + 2*hi + 1, e + 4 + 2*hi, e + 5 + 2*hi} {
			if want := IndexerQByte(h, d+j); b != want {
				t.Fatalf("query (%d, %d): byte %d, IndexerQByte %d", h, d+j, b, want)
			}
		}
	}
	off := func(r, k int) int { return ((k>>4)*8+(r>>3))<<7 + (r&7)<<4 + k&15 }
	seen := make([]bool, 64*128)
	for r := range 64 {
		for k := range 128 {
			o := off(r, k)
			if seen[o] {
				t.Fatalf("WGI_OFF(%d, %d) = %d taken twice", r, k, o)
			}
			seen[o] = true
		}
	}
	// Reduce-scatter: lane (g, c) starts with v[2j+e] = value of key
	// 8j+2c+e from lane group g; the sum over g must land once per key.
	var v [32][16]float64
	want := make([]float64, 64)
	r := rand.New(rand.NewPCG(5, 6))
	for lane := range 32 {
		for idx := range 16 {
			x := float64(r.IntN(1000))
			v[lane][idx] = x
			want[8*(idx>>1)+2*(lane&3)+idx&1] += x
		}
	}
	sel := func(b bool, x, y float64) float64 {
		if b {
			return x
		}
		return y
	}
	shfl := func(vals [32]float64, m int) [32]float64 {
		var o [32]float64
		for l := range 32 {
			o[l] = vals[l^m]
		}
		return o
	}
	var u [32][8]float64
	for i := range 8 {
		var snd [32]float64
		for l := range 32 {
			snd[l] = sel((l>>2)&1 != 0, v[l][i], v[l][8+i])
		}
		got := shfl(snd, 4)
		for l := range 32 {
			u[l][i] = sel((l>>2)&1 != 0, v[l][8+i], v[l][i]) + got[l]
		}
	}
	var x4 [32][4]float64
	for i := range 4 {
		var snd [32]float64
		for l := range 32 {
			snd[l] = sel((l>>2)&2 != 0, u[l][i], u[l][4+i])
		}
		got := shfl(snd, 8)
		for l := range 32 {
			x4[l][i] = sel((l>>2)&2 != 0, u[l][4+i], u[l][i]) + got[l]
		}
	}
	got := make([]float64, 64)
	hits := make([]int, 64)
	for i := range 2 {
		var snd [32]float64
		for l := range 32 {
			snd[l] = sel((l>>2)&4 != 0, x4[l][i], x4[l][2+i])
		}
		gs := shfl(snd, 16)
		for l := range 32 {
			g, c := l>>2, l&3
			jj := 4*(g&1) + (g & 2) + (g>>2)&1
			key := 8*jj + 2*c + i
			got[key] = sel(g&4 != 0, x4[l][2+i], x4[l][i]) + gs[l]
			hits[key]++
		}
	}
	for key := range 64 {
		if hits[key] != 1 || got[key] != want[key] {
			t.Fatalf("key %d: written %d times, %v want %v", key, hits[key], got[key], want[key])
		}
	}
}
