package kernels

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/tilert-go/tilert/cuda"
)

// TestNVRTCQBAbsorbKernels: the qb_absorb kernels compile for sm_90 within
// one block's register file share of two blocks an SM (128), so a head's
// block leaves room beside it (no GPU needed).
func TestNVRTCQBAbsorbKernels(t *testing.T) {
	log, version := ptxasLogSM90(t, AbsorbKernelSource(), "tilert_kernels_absorb.cu")
	var lim []regLimit
	for _, n := range []string{"qb_absorb_g32_r4", "qb_absorb_g64_r8", "qb_absorb_g32_r4_c2", "qb_absorb_g64_r8_c2"} {
		lim = append(lim, regLimit{n, 128}, regLimit{n + "_n", 128})
	}
	checkRegisters(t, log, version, lim)
}

// TestKernelQBAbsorb checks qb_absorb on fresh random inputs against the two
// launches it replaces, q_b's one-row tile GEMV then absorb_q_fast (plain
// and its _n form), bit for bit: q_b's row, the absorbed sums and the
// rotated RoPE part (none, half-split, interleaved), at one and two blocks
// a head and auto (one where the heads give 3/4 of the SMs a block,
// refused elsewhere), with and without the L2 prefetch; q_b's row against float64 too.
// Shapes: DeepSeek-V3.2 dims (128 heads, nope 128, q_b rows of 1536: groups
// of 32) and GLM-5 dims (64 heads, nope 192, rows of 2048: groups of 64),
// and two small ones of the same group sizes. It also asks that a shape
// off the kernel's (rows of 1024: another group size) is refused.
func TestKernelQBAbsorb(t *testing.T) {
	onGPU(t, func(c *cuda.Ctx, k *Set, a *allocs, r *rand.Rand) {
		if err := k.AbsorbFastSupported(); err != nil {
			t.Skipf("absorb module: %v", err)
		}
		s := c.Stream()
		n0 := QBAbsorbLaunches.Load()
		const R, P, eps = 512, 64, 1e-6
		for _, sh := range []struct{ H, nope, K int }{{128, 128, 1536}, {64, 192, 2048}, {40, 128, 1536}, {36, 192, 2048}} {
			H, nope, K := sh.H, sh.nope, sh.K
			hs := nope + P
			N := H * hs
			xs := randF32(r, K, 1)
			x := a.up(xs)
			wqb, sqb := randFP8(r, N*K), randScales(r, cdiv(N, 128)*cdiv(K, 128), -7)
			wq, sq, wqf := a.up(wqb), a.up(sqb), fp8At(wqb, sqb, K)
			uk, uks, _ := randFP8Rows(r, a, H*nope, R)
			ss := randF32(r, 12, 1)
			for i := range ss {
				ss[i] = ss[i]*ss[i] + 0.5
			}
			qs := QScale{SumSq: a.up(ss), N: len(ss), K: K, Eps: eps}
			const maxPos = 40
			pos := []int32{int32(r.IntN(maxPos))}
			cosT, sinT := randF32(r, maxPos*P/2, 1), randF32(r, maxPos*P/2, 1)
			ropes := []QRope{{}, {Pos: a.up(pos), Cos: a.up(cosT), Sin: a.up(sinT)}, {Pos: a.up(pos), Cos: a.up(cosT), Sin: a.up(sinT), Interleaved: true}}
			base := QBAbsorbArgs{X: x, WQ: wq, SQ: sq, W: uk, S: uks, H: H, Nope: nope, R: R, HS: hs, P: P, K: K, Blocks: 1}
			if absorbCols(c.Info().SMs, H, R) != 8 {
				if k.QBAbsorbOK(base) {
					t.Errorf("H=%d on %d SMs: QBAbsorbOK takes a shape absorb_q_fast splits otherwise", H, c.Info().SMs)
				}
				continue
			}
			// The two launches.
			q0 := a.poisoned(N)
			chk(k.GemvFP8Tile(s, q0, x, wq, sq, 0, N, K, 1, K, N))
			qRef := downF32(c, q0, N)
			ref := make([]float64, N)
			for n := range N {
				var acc float64
				for kk := range K {
					acc += wqf(n, kk) * float64(xs[kk])
				}
				ref[n] = acc
			}
			record(t, fmt.Sprintf("q_b tile H=%d K=%d", H, K), relMetric, relErr(qRef, ref), boundF32)
			for ri, rp := range ropes {
				for _, scaled := range []bool{false, true} {
					out0, qpe0 := a.poisoned(H*R), a.poisoned(H*P)
					if scaled {
						chk(k.AbsorbQFastScaled(s, out0, qpe0, q0, uk, uks, H, nope, R, hs, P, rp, qs))
					} else {
						chk(k.AbsorbQFast(s, out0, qpe0, q0, uk, uks, H, nope, R, hs, P, rp))
					}
					wantO, wantP := downF32(c, out0, H*R), downF32(c, qpe0, H*P)
					for _, blocks := range []int{0, 1, 2} {
						for _, pf := range []bool{false, true} {
							ar := base
							ar.Blocks, ar.Prefetch, ar.Rope = blocks, pf, rp
							if scaled {
								ar.QS = qs
							}
							ar.Q, ar.Out, ar.QPE = a.poisoned(N), a.poisoned(H*R), a.poisoned(H*P)
							tag := fmt.Sprintf("H=%d nope=%d K=%d rope %d scaled %v blocks %d prefetch %v", H, nope, K, ri, scaled, blocks, pf)
							if blocks == 0 && ar.blocks(c.Info().SMs) == 0 {
								// Auto takes one block a head only where 3/4 of the SMs get one.
								if k.QBAbsorbOK(ar) {
									t.Errorf("%s: auto takes %d heads on %d SMs", tag, H, c.Info().SMs)
								}
								continue
							}
							if !k.QBAbsorbOK(ar) {
								t.Errorf("%s: QBAbsorbOK refuses it", tag)
								continue
							}
							chk(k.QBAbsorb(s, ar))
							record(t, "qb_absorb q_b row == q_b tile "+tag, "differing values", float64(diffF32Bits(downF32(c, ar.Q, N), qRef)), 0)
							record(t, "qb_absorb == absorb_q_fast "+tag, "differing values",
								float64(diffF32Bits(downF32(c, ar.Out, H*R), wantO)+diffF32Bits(downF32(c, ar.QPE, H*P), wantP)), 0)
						}
					}
				}
			}
		}
		// Rows of 1024 bytes run q_b on groups of 64 with nope 128: not
		// compiled. (The check reads no memory: small aligned buffers.)
		off := QBAbsorbArgs{X: a.poisoned(1024), WQ: a.poisoned(16), SQ: a.poisoned(16), W: a.poisoned(16), S: a.poisoned(16),
			H: 128, Nope: 128, R: R, HS: 192, P: P, K: 1024, Blocks: 1}
		if k.QBAbsorbOK(off) {
			t.Error("QBAbsorbOK takes q_b rows of 1024 at nope 128")
		}
		if QBAbsorbLaunches.Load() == n0 {
			t.Fatal("no qb_absorb launch was counted")
		}
	})
}
