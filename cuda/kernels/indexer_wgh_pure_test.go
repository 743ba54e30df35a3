package kernels

// indexer_scores_wgh's index arithmetic transcribed (no GPU): the keys' A
// fragments from a lane's two 16-byte loads a key row, the query's B
// layout built from idx_q_prep's fragment-ordered codes, and the
// accumulator's key / head positions. The products must be the plain dot
// products of every key with every head, whatever the permutation of k.

import (
	"math"
	"math/rand/v2"
	"strings"
	"testing"
)

// wghKeyByte is the key-row byte (physical dimension) behind logical k of
// a k16 step in lane quad position c (scores_wgh.cu: af[4ks + e] from word
// ks & 3 of the load at 16c, or 64 + 16c for ks >= 4; e = 0, 1 the low
// pair, 2, 3 the high pair, 8 logical k on).
func wghKeyByte(k int) int {
	ks, kk := k/16, k%16
	hi := 0
	if kk >= 8 {
		hi, kk = 2, kk-8
	}
	c, off := kk/2, kk%2
	base := 16*c + 4*(ks&3)
	if ks >= 4 {
		base += 64
	}
	return base + hi + off
}

// wghOff is WGH_OFF: the byte of (head r, logical k) in B.
func wghOff(r, k int) int { return ((k>>3)*8+(r>>3))<<7 + (r&7)<<4 + (k&7)<<1 }

// wghQueryB transcribes the B fill: for each 4-byte store, the qh byte
// offsets of its two halves, keyed by WGH_OFF (the low half's byte).
func wghQueryB() map[int][2]int {
	b := make(map[int][2]int)
	for i := range IndexerQRowBytes / 8 {
		cc, gg, ks, mt := i&3, (i>>2)&7, (i>>5)&7, i>>8
		k0 := 16*ks + 2*cc
		for hi := range 2 {
			h := 16*mt + gg + 8*hi
			// v.x >> 16hi: bytes 2hi, 2hi+1; v.y >> 16hi: bytes 4+2hi, 5+2hi.
			b[wghOff(h, k0)] = [2]int{8*i + 2*hi, 8*i + 2*hi + 1}
			b[wghOff(h, k0+8)] = [2]int{8*i + 4 + 2*hi, 8*i + 5 + 2*hi}
		}
	}
	return b
}

func TestIndexerWGHMapping(t *testing.T) {
	// The keys' logical k is a permutation of the 128 dimensions.
	seen := make([]bool, IndexerHeadDim)
	for k := range IndexerHeadDim {
		d := wghKeyByte(k)
		if d < 0 || d >= IndexerHeadDim || seen[d] {
			t.Fatalf("logical k %d -> key byte %d: out of range or taken twice", k, d)
		}
		seen[d] = true
	}
	// B: every (head, logical k) written once, from the query byte of the
	// same physical dimension the keys use for that k.
	b := wghQueryB()
	if len(b)*4 != IndexerQHeads*IndexerHeadDim*2 {
		t.Fatalf("B fill writes %d words, want %d", len(b), IndexerQHeads*IndexerHeadDim/2)
	}
	for h := range IndexerQHeads {
		for k := 0; k < IndexerHeadDim; k += 2 {
			src, ok := b[wghOff(h, k)]
			if !ok {
				t.Fatalf("B (head %d, k %d) never written", h, k)
			}
			for o := range 2 {
				if want := IndexerQByte(h, wghKeyByte(k+o)); src[o] != want {
					t.Fatalf("B (head %d, k %d) from qh byte %d, want %d (dimension %d)", h, k+o, src[o], want, wghKeyByte(k+o))
				}
			}
		}
	}
}

// The products through the transcribed fragments equal the plain dots:
// each lane's A registers (keys 16w + g, + 8), B from qh, the accumulator
// positions acc[4j + e] -> (key 16w + g + 8 (e >> 1), head 8j + 2c + (e & 1)).
func TestIndexerWGHProducts(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 40))
	const D, H = IndexerHeadDim, IndexerQHeads
	q := make([][]float64, H)
	qh := make([]float64, IndexerQRowBytes)
	for h := range H {
		q[h] = make([]float64, D)
		for d := range D {
			q[h][d] = float64(r.IntN(33) - 16)
			qh[IndexerQByte(h, d)] = q[h][d]
		}
	}
	keys := make([][]float64, 64)
	for i := range keys {
		keys[i] = make([]float64, D)
		for d := range D {
			keys[i][d] = float64(r.IntN(33) - 16)
		}
	}
	bsrc := wghQueryB()
	bval := func(h, k int) float64 { // B (head h, logical k) as the tensor core reads it
		p := bsrc[wghOff(h, k&^1)]
		return qh[p[k&1]]
	}
	for w := range 4 {
		for lane := range 32 {
			g, c := lane>>2, lane&3
			var acc [32]float64
			for ks := range 8 {
				// The fragment a lane holds is one quarter of the warp's
				// A; the product sums over the whole warp's A, so take the
				// rows the accumulator names and all 16 k of the step.
				for j := range 8 {
					for e := range 4 {
						key := 16*w + g + 8*(e>>1)
						head := 8*j + 2*c + (e & 1)
						for kk := range 16 {
							k := 16*ks + kk
							acc[4*j+e] += keys[key][wghKeyByte(k)] * bval(head, k)
						}
					}
				}
			}
			for j := range 8 {
				for e := range 4 {
					key, head := 16*w+g+8*(e>>1), 8*j+2*c+(e&1)
					var want float64
					for d := range D {
						want += keys[key][d] * q[head][d]
					}
					if math.Abs(acc[4*j+e]-want) > 0 {
						t.Fatalf("lane (%d, %d, %d) acc[%d] (key %d, head %d) = %v, want %v", w, g, c, 4*j+e, key, head, acc[4*j+e], want)
					}
				}
			}
		}
	}
	// The lane's A registers: logical k 2c + o from its own load bytes.
	for c := range 4 {
		for ks := range 8 {
			for _, kk := range []int{2 * c, 2*c + 1, 2*c + 8, 2*c + 9} {
				d := wghKeyByte(16*ks + kk)
				lo := 16 * c
				if ks >= 4 {
					lo += 64
				}
				if d < lo || d >= lo+16 {
					t.Fatalf("lane c %d step %d logical k %d needs key byte %d outside its load [%d, %d)", c, ks, kk, d, lo, lo+16)
				}
			}
		}
	}
}

// The kernel text keeps the layout this file transcribes.
func TestIndexerWGHSource(t *testing.T) {
	src := WGKernelSource()
	for _, want := range []string{
		"#define WGH_OFF(r, c) (((((c) >> 3) * 8 + ((r) >> 3)) << 7) + (((r) & 7) << 4) + (((c) & 7) << 1))",
		"*(u32*)(qb + WGH_OFF(h, k0)) = wgh_cvt(v.x >> (16 * hi));",
		"*(u32*)(qb + WGH_OFF(h, k0 + 8)) = wgh_cvt(v.y >> (16 * hi));",
		"af[4 * ks + 2] = wgh_cvt(wa >> 16);",
		"const u8* ka = pg + (16 * w + g) * WGH_D + 16 * c;",
		"extern \"C\" __global__ void __launch_bounds__(128, 4) indexer_scores_wgh(",
		"extern \"C\" __global__ void __launch_bounds__(128, 4) indexer_scores_wgh_rows(",
	} {
		if !strings.Contains(src, want) {
			t.Errorf("cu/wg/scores_wgh.cu no longer has %q", want)
		}
	}
	if strings.Contains(KernelSource(), "indexer_scores_wgh") {
		t.Error("the main module's source holds indexer_scores_wgh (it belongs to the sm_90a module)")
	}
}

func TestIndexerWGHBlocks(t *testing.T) {
	for _, cs := range []struct{ sms, nq, T, want int }{
		{132, 1, 8192, 128}, {132, 1, 8256, 129}, {132, 1, 131072, 512}, {132, 4, 131072, 128}, {132, 1, 64, 1}, {1, 1, 100, 2},
	} {
		if got := indexerWGHBlocks(cs.sms, cs.nq, cs.T); got != cs.want {
			t.Errorf("indexerWGHBlocks(%d, %d, %d) = %d, want %d", cs.sms, cs.nq, cs.T, got, cs.want)
		}
	}
}

// The two-warpgroup kernels launch on half the blocks, so that the pages
// a warpgroup takes are the same count.
func TestIndexerWGHLaunch(t *testing.T) {
	for _, pair := range []bool{false, true} {
		for _, cs := range []struct{ name string }{{indexerWGHName}, {indexerWGHRowsName}} {
			for _, T := range []int{100, 8256, 131072} {
				name, grid, block := indexerWGHLaunch(cs.name, pair, 132, 1, T)
				nbx := indexerWGHBlocks(132, 1, T)
				wantName, wantX, wantT := cs.name, nbx, 128
				if pair {
					wantName, wantX, wantT = strings.Replace(cs.name, "wgh", "wgh2", 1), cdiv(nbx, 2), 256
				}
				if name != wantName || grid.X != wantX || block.X != wantT {
					t.Errorf("pair %v %s T=%d: %s grid %d block %d, want %s %d %d", pair, cs.name, T, name, grid.X, block.X, wantName, wantX, wantT)
				}
				if !strings.Contains(WGKernelSource(), "void __launch_bounds__("+map[bool]string{false: "128, 4", true: "256, 2"}[pair]+") "+name+"(") {
					t.Errorf("%s: not defined with its launch bounds in cu/wg", name)
				}
			}
		}
	}
}
