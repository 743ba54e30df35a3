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
