package kernels

import (
	"encoding/binary"
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
	"unsafe"

	"github.com/tilert-go/tilert/cuda"
	"github.com/tilert-go/tilert/engine"
)

// Checks of kernels/exact.cu (float32 caches of the engine's exact mode,
// the bf16 MLA cache): cache writes byte-exact against the engine's
// encoders with untouched entries left poisoned; scores and attention
// against float64 references on fresh random inputs, outputs NaN-poisoned.

func f32Bytes(v []float32) []byte {
	if len(v) == 0 {
		return nil
	}
	return unsafe.Slice((*byte)(unsafe.Pointer(&v[0])), 4*len(v))
}

func TestKernelExactCacheWrites(t *testing.T) {
	onGPU(t, func(c *cuda.Ctx, k *Set, a *allocs, r *rand.Rand) {
		s := c.Stream()
		const ntok, npos, ld = 6, 200, 576 + 8
		src := randF32(r, ntok*ld, 1)
		for i := 0; i < 64; i++ {
			src[2*ld+i] *= 1e-30 // bf16 subnormal range
			src[3*ld+i] *= 1e30
		}
		pos := []int32{70, 3, -1, 191, 64, 0}
		pp := a.up(pos)

		// float32 entries: a plain copy, everything else stays NaN.
		cp := a.poisoned(npos * 576)
		chk(k.EngMLACacheWriteF32(s, cp, a.up(src), pp, ntok, ld))
		got := downF32(c, cp, npos*576)
		want := make([]float32, npos*576)
		for i := range want {
			want[i] = math.Float32frombits(0x7fc00000)
		}
		for i, p := range pos {
			if p >= 0 {
				copy(want[int(p)*576:(int(p)+1)*576], src[i*ld:i*ld+576])
			}
		}
		record(t, "eng_mla_cache_write_f32 (poisoned cache)", "mismatched bytes", float64(diffBytes(f32Bytes(got), f32Bytes(want))), 0)

		// bf16 entries: engine.EncodeMLABF16's bytes.
		bcache := make([]byte, npos*MLABF16TokenBytes)
		for i := range bcache {
			bcache[i] = 0xab
		}
		bp := a.up(bcache)
		chk(k.EngMLACacheWriteBF16(s, bp, a.up(src), pp, ntok, ld))
		bgot := make([]byte, len(bcache))
		chk(c.Download(bgot, bp))
		bwant := append([]byte(nil), bcache...)
		for i, p := range pos {
			if p >= 0 {
				engine.EncodeMLABF16(bwant[int(p)*MLABF16TokenBytes:(int(p)+1)*MLABF16TokenBytes], src[i*ld:i*ld+512], src[i*ld+512:i*ld+576])
			}
		}
		record(t, "eng_mla_cache_write_bf16 vs engine.EncodeMLABF16", "mismatched bytes", float64(diffBytes(bgot, bwant)), 0)

		const ild = 136
		keys := randF32(r, ntok*ild, 0.5)
		ip := a.poisoned(npos * 128)
		chk(k.EngIndexerCacheWriteF32(s, ip, a.up(keys), pp, ntok, ild))
		igot := downF32(c, ip, npos*128)
		iwant := make([]float32, npos*128)
		for i := range iwant {
			iwant[i] = math.Float32frombits(0x7fc00000)
		}
		for i, p := range pos {
			if p >= 0 {
				copy(iwant[int(p)*128:(int(p)+1)*128], keys[i*ild:i*ild+128])
			}
		}
		record(t, "eng_indexer_cache_write_f32 (poisoned cache)", "mismatched bytes", float64(diffBytes(f32Bytes(igot), f32Bytes(iwant))), 0)
	})
}

func TestKernelExactIndexerScores(t *testing.T) {
	onGPU(t, func(c *cuda.Ctx, k *Set, a *allocs, r *rand.Rand) {
		s := c.Stream()
		for _, cs := range []struct {
			H, T int
			lens []int32
		}{{64, 300, []int32{300, 250}}, {8, 130, []int32{65, 130, 1}}, {20, 64, []int32{64}}} {
			H, T, nq := cs.H, cs.T, len(cs.lens)
			// Only positions < T exist; the kernel must not need more.
			keys := randF32(r, T*128, 0.7)
			q := randF32(r, nq*H*128, 1)
			w := randF32(r, nq*H, 1)
			const qkScale = 0.088
			ldOut := T + 5
			op := a.poisoned(nq * ldOut)
			chk(k.EngIndexerScoresF32(s, op, a.up(q), a.up(w), a.up(keys), a.up(cs.lens), nq, H, T, ldOut, qkScale))
			got := downF32(c, op, nq*ldOut)
			var gotV []float32
			var ref []float64
			for qi := range nq {
				for tt := range T {
					gotV = append(gotV, got[qi*ldOut+tt])
					if tt >= int(cs.lens[qi]) {
						ref = append(ref, math.Inf(-1))
						continue
					}
					var score float64
					for h := range H {
						var d float64
						for i := range 128 {
							d += float64(q[(qi*H+h)*128+i]) * float64(keys[tt*128+i])
						}
						score += float64(w[qi*H+h]) * math.Max(0, qkScale*d)
					}
					ref = append(ref, score)
				}
			}
			record(t, fmt.Sprintf("eng_indexer_scores_f32 nq=%d H=%d T=%d", nq, H, T), relMetric, relErr(gotV, ref), boundF32)
		}
	})
}

func TestKernelExactMLADecode(t *testing.T) {
	onGPU(t, func(c *cuda.Ctx, k *Set, a *allocs, r *rand.Rand) {
		s := c.Stream()
		const nq, H, T = 3, 16, 300
		lens := []int32{300, 270, 5}
		qn := randF32(r, nq*H*512, 1)
		qp := randF32(r, nq*H*64, 1)
		const scale = 0.3
		const ldIdx, nidx = 260, 256
		idx := make([]int32, nq*ldIdx)
		for qi := range nq {
			perm := r.Perm(T)
			for j := range ldIdx {
				idx[qi*ldIdx+j] = -1
				if j < nidx && (qi != 0 || j < 200) {
					// row 1 and 2 also get positions >= lens: skipped
					idx[qi*ldIdx+j] = int32(perm[j])
				}
			}
		}
		for _, bf16 := range []bool{false, true} {
			vals := randF32(r, T*576, 0.5)
			var cache []byte
			if bf16 {
				cache = make([]byte, T*MLABF16TokenBytes)
				for tk := range T {
					engine.EncodeMLABF16(cache[tk*MLABF16TokenBytes:], vals[tk*576:tk*576+512], vals[tk*576+512:(tk+1)*576])
				}
			} else {
				cache = append([]byte(nil), f32Bytes(vals)...)
			}
			entry := func(tk int) []float64 {
				v := make([]float64, 576)
				for i := range v {
					if bf16 {
						v[i] = bf16ToF64(binary.LittleEndian.Uint16(cache[tk*MLABF16TokenBytes+2*i:]))
					} else {
						v[i] = float64(vals[tk*576+i])
					}
				}
				return v
			}
			cp := a.up(cache)
			for _, sparse := range []bool{true, false} {
				op := a.poisoned(nq * H * 512)
				ip, n := cuda.DevPtr(0), T
				if sparse {
					ip, n = a.up(idx), nidx
				}
				if bf16 {
					chk(k.EngMLADecodeBF16(s, op, a.up(qn), a.up(qp), cp, ip, a.up(lens), nq, H, n, ldIdx, scale))
				} else {
					chk(k.EngMLADecodeF32(s, op, a.up(qn), a.up(qp), cp, ip, a.up(lens), nq, H, n, ldIdx, scale))
				}
				got := downF32(c, op, nq*H*512)
				var worst float64
				for qi := range nq {
					var toks []int
					if sparse {
						for j := range nidx {
							if v := idx[qi*ldIdx+j]; v >= 0 && v < lens[qi] {
								toks = append(toks, int(v))
							}
						}
					} else {
						for tk := range int(lens[qi]) {
							toks = append(toks, tk)
						}
					}
					for h := range H {
						sc := make([]float64, len(toks))
						mx := math.Inf(-1)
						var maxC float64
						ents := make([][]float64, len(toks))
						for j, tk := range toks {
							ents[j] = entry(tk)
							var d float64
							for i := range 512 {
								d += float64(qn[(qi*H+h)*512+i]) * ents[j][i]
								maxC = math.Max(maxC, math.Abs(ents[j][i]))
							}
							for i := range 64 {
								d += float64(qp[(qi*H+h)*64+i]) * ents[j][512+i]
							}
							sc[j] = d * scale
							mx = math.Max(mx, sc[j])
						}
						o := make([]float64, 512)
						var l float64
						for j := range toks {
							p := math.Exp(sc[j] - mx)
							l += p
							for i := range 512 {
								o[i] += p * ents[j][i]
							}
						}
						for i := range 512 {
							g := float64(got[(qi*H+h)*512+i])
							if math.IsNaN(g) {
								worst = math.Inf(1)
							}
							worst = math.Max(worst, math.Abs(g-o[i]/l)/maxC)
						}
					}
				}
				kind := "f32"
				if bf16 {
					kind = "bf16"
				}
				mode := "dense len=300/270/5"
				if sparse {
					mode = "top-k idx (padding, past-len entries)"
				}
				record(t, fmt.Sprintf("eng_mla_decode_%s nq=3 H=16 %s", kind, mode), "max|d|/max|c|", worst, boundF32)
			}
		}
	})
}
