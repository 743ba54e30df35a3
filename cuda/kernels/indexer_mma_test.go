package kernels

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/tilert-go/tilert/cuda"
	"github.com/tilert-go/tilert/numeric"
)

// refIndexerQPrep is IndexerQPrep after RoPE: roped [M][H][128] to the
// codes in IndexerQByte order, wq and the per-head scales.
func refIndexerQPrep(roped, w []float32, M, H int, wscale float32) (qh []byte, wq, scales []float32) {
	qh = make([]byte, M*IndexerQRowBytes)
	wq = make([]float32, M*IndexerQHeads)
	scales = make([]float32, M*H)
	for m := range M {
		for h := range H {
			v := roped[(m*H+h)*IndexerHeadDim : (m*H+h+1)*IndexerHeadDim]
			var amax float32
			for _, x := range v {
				amax = max(amax, float32(math.Abs(float64(x))))
			}
			sc := ue8m0Ceil(max(amax, 1e-10) / 448)
			scales[m*H+h] = sc
			for d, x := range v {
				qh[m*IndexerQRowBytes+IndexerQByte(h, d)] = numeric.Float32ToFP8E4M3(x / sc)
			}
			wq[m*IndexerQHeads+h] = w[m*H+h] * wscale * sc
		}
	}
	return qh, wq, scales
}

// ue8m0Ceil is engine.UE8M0Ceil (the smallest power of two >= s).
func ue8m0Ceil(s float32) float32 {
	frac, exp := math.Frexp(float64(s))
	if frac == 0.5 {
		return s
	}
	return float32(math.Ldexp(1, exp))
}

// checkIndexerMMA checks IndexerQPrep (bytes and weights identical to RoPE
// then the ue8m0 quantisation) and IndexerScoresMMA (against the float64
// score of the dequantised query, IndexerScores' formula) on fresh random
// inputs: paged caches, rows of different lengths, fewer than 64 heads, and
// a row long enough that warps take several key groups.
func checkIndexerMMA(t *testing.T, c *cuda.Ctx, k *Set, a *allocs, r *rand.Rand) {
	s := c.Stream()
	const D = IndexerHeadDim
	const maxPos, rot = 4096, 64
	half := rot / 2
	cosT, sinT := make([]float32, maxPos*half), make([]float32, maxPos*half)
	for p := range maxPos {
		for i := range half {
			th := float64(p) * math.Pow(10000, -float64(2*i)/rot)
			cosT[p*half+i], sinT[p*half+i] = float32(math.Cos(th)), float32(math.Sin(th))
		}
	}
	cp, sp := a.up(cosT), a.up(sinT)
	for _, cs := range []struct {
		name        string
		H, T, K     int
		lens        []int32
		interleaved bool
		paged       bool
	}{
		{"H=64 T=1000 paged", 64, 1000, 256, []int32{1000, 963, 100}, false, true},
		{"H=20 T=300 interleaved", 20, 300, 64, []int32{300, 17}, true, false},
		{"H=64 T=65836", 64, 65836, 2048, []int32{65836}, false, false},
	} {
		M := len(cs.lens)
		q := randF32(r, M*cs.H*D, 1)
		w := randF32(r, M*cs.H, 1)
		pos := make([]int32, M)
		for i := range pos {
			pos[i] = int32(r.IntN(maxPos))
		}
		const qkScale = 0.088
		wscale := float32(math.Pow(float64(cs.H), -0.5)) * qkScale
		qp, wp, pp := a.up(q), a.up(w), a.up(pos)
		qhp := a.raw(int64(M * IndexerQRowBytes))
		chk(c.MemsetD32(qhp, 0x7f7f7f7f, int64(M*IndexerQRowBytes/4), s))
		wqp := a.poisoned(M * IndexerQHeads)
		chk(k.IndexerQPrep(s, qhp, wqp, qp, wp, pp, cp, sp, M, cs.H, rot, cs.interleaved, wscale))
		qh := make([]byte, M*IndexerQRowBytes)
		chk(c.Download(qh, qhp))
		wq := downF32(c, wqp, M*IndexerQHeads)
		// Reference: the RoPE kernel (checked on its own) on a copy, then
		// the quantisation on the CPU.
		rp := a.up(q)
		chk(k.RoPE(s, rp, pp, cp, sp, M*cs.H, cs.H, D, 0, rot, cs.interleaved))
		roped := downF32(c, rp, M*cs.H*D)
		wantQ, wantW, scales := refIndexerQPrep(roped, w, M, cs.H, wscale)
		bad := 0
		for i := range qh {
			if qh[i] != wantQ[i] {
				bad++
			}
		}
		for i := range wq {
			if math.Float32bits(wq[i]) != math.Float32bits(wantW[i]) {
				bad++
			}
		}
		record(t, "idx_q_prep "+cs.name+" vs rope+quant", "mismatched bytes/weights", float64(bad), 0)

		cache, bt, btp := randIndexerKeys(r, a, cs.T, cs.paged)
		ldOut := cs.T + 3
		op := a.poisoned(M * ldOut)
		cp8, lp := a.up(cache), a.up(cs.lens)
		chk(k.IndexerScoresMMA(s, op, qhp, wqp, cp8, btp, lp, 0, M, cs.T, ldOut))
		got := downF32(c, op, M*ldOut)
		// Fused: the same scores while building the radix top-k's
		// histogram, then TopKRadixAfterHist (twice on one scratch).
		scratch := a.up(make([]byte, TopKRadixScratchBytes(M, cs.T)))
		for rep := range 2 {
			opf := a.poisoned(M * ldOut)
			chk(k.IndexerScoresMMA(s, opf, qhp, wqp, cp8, btp, lp, TopKRadixHist(scratch), M, cs.T, ldOut))
			gotF := downF32(c, opf, M*ldOut)
			bad := 0
			for i := range M * ldOut {
				if i%ldOut < cs.T && math.Float32bits(gotF[i]) != math.Float32bits(got[i]) {
					bad++
				}
			}
			sel := a.poisoned(M * cs.K)
			chk(k.TopKRadixAfterHist(s, sel, opf, lp, scratch, M, cs.T, cs.K, ldOut, cs.K))
			gotSel := downI32(c, sel, M*cs.K)
			for m := range M {
				want := refTopK(gotF[m*ldOut:m*ldOut+cs.T], int(cs.lens[m]), cs.K)
				for j := range cs.K {
					if gotSel[m*cs.K+j] != want[j] {
						bad++
					}
				}
			}
			record(t, fmtName("indexer_scores_mma+hist, topk_radix after hist K=%d %s (call %d)", cs.K, cs.name, rep+1),
				"mismatched scores/indices", float64(bad), 0)
		}
		var gotV []float32
		var ref []float64
		qdeq := make([]float64, M*cs.H*D)
		for m := range M {
			for h := range cs.H {
				for i := range D {
					qdeq[(m*cs.H+h)*D+i] = fp8Table[wantQ[m*IndexerQRowBytes+IndexerQByte(h, i)]] * float64(scales[m*cs.H+h])
				}
			}
		}
		kdeq := make([]float64, D)
		for m := range M {
			for tt := range cs.T {
				gotV = append(gotV, got[m*ldOut+tt])
				if tt >= int(cs.lens[m]) {
					ref = append(ref, math.Inf(-1))
					continue
				}
				pgi := tt / 64
				if bt != nil {
					pgi = int(bt[pgi])
				}
				pg := cache[pgi*IndexerPageBytes:]
				ks := float64(getF32(pg[64*128+4*(tt%64):]))
				for i := range D {
					kdeq[i] = fp8Table[pg[(tt%64)*128+i]] * ks
				}
				var score float64
				for h := range cs.H {
					var d float64
					qv := qdeq[(m*cs.H+h)*D : (m*cs.H+h+1)*D]
					for i := range D {
						d += qv[i] * kdeq[i]
					}
					score += float64(w[m*cs.H+h]) * math.Pow(float64(cs.H), -0.5) * math.Max(0, qkScale*d)
				}
				ref = append(ref, score)
			}
		}
		record(t, "indexer_scores_mma "+cs.name, relMetric, relErr(gotV, ref), boundF32)
	}
}

// IndexerQByte must place every (head, dimension) of a row at its own byte.
func TestIndexerQByteIsPermutation(t *testing.T) {
	seen := make([]bool, IndexerQRowBytes)
	for h := range IndexerQHeads {
		for d := range IndexerHeadDim {
			b := IndexerQByte(h, d)
			if b < 0 || b >= IndexerQRowBytes || seen[b] {
				t.Fatalf("IndexerQByte(%d, %d) = %d: out of range or taken twice", h, d, b)
			}
			seen[b] = true
		}
	}
}
