package kernels

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/tilert-go/tilert/cuda"
)

// The heads kernel's split plan: whole tiles, bounded by the token count and
// mlaHeadsSplits, the SMs filled once, and a scratch bound that covers every
// plan (including tensor-parallel ranks left without heads).
func TestMLAHeadsPlan(t *testing.T) {
	for _, tc := range []struct{ sms, nq, H, nidx, want int }{
		{132, 1, 128, 2048, 17}, // 8 head groups: 17 ranges of 4 tiles -> 136 blocks
		{132, 4, 128, 2048, 5},
		{132, 1, 128, 40, 2}, // 2 tiles of tokens
		{132, 32, 128, 2048, 1},
		{132, 1, 4, 2048, 64}, // one head group: one range per tile
		{132, 1, 0, 2048, 64},
		{1000, 1, 16, 1 << 20, mlaHeadsSplits},
	} {
		got := mlaHeadsSplitsFor(tc.sms, tc.nq, tc.H, tc.nidx)
		if got != tc.want {
			t.Errorf("splits(sms=%d nq=%d H=%d nidx=%d) = %d, want %d", tc.sms, tc.nq, tc.H, tc.nidx, got, tc.want)
		}
		if tc.H > 0 && MLAWorkspaceBytes(tc.nq, tc.H, got) > MLAHeadsWorkspaceBytes(tc.nq, tc.H) {
			t.Errorf("nq=%d H=%d: plan needs %d bytes, bound %d", tc.nq, tc.H, MLAWorkspaceBytes(tc.nq, tc.H, got), MLAHeadsWorkspaceBytes(tc.nq, tc.H))
		}
	}
	if b := MLAHeadsWorkspaceBytes(4, 0); b != 0 {
		t.Errorf("no heads: %d bytes of scratch", b)
	}
}

// mla_decode_wg2's split plan: 64 heads a block, one block an SM, whole
// 64-token tiles, at most 32 ranges, and a scratch bound that covers every
// plan up to maxRows rows.
func TestMLAWG2Plan(t *testing.T) {
	for _, tc := range []struct{ sms, nq, H, nidx, want int }{
		{132, 1, 128, 2048, 32}, // 2 head blocks x 32 one-tile ranges (66 wanted, 32 tiles)
		{132, 4, 128, 2048, 17}, // 8 blocks x 17 -> 136 (ranges of 2 tiles: 16 in the launch)
		{132, 2, 128, 2048, 32},
		{132, 1, 64, 2048, 32},
		{132, 8, 128, 2048, 9},
		{132, 1, 128, 100, 2},
		{132, 1, 0, 2048, 32},
		{1000, 1, 64, 1 << 20, mlaWG2MaxSplits},
	} {
		got := mlaWG2SplitsFor(tc.sms, tc.nq, tc.H, tc.nidx)
		if got != tc.want {
			t.Errorf("splits(sms=%d nq=%d H=%d nidx=%d) = %d, want %d", tc.sms, tc.nq, tc.H, tc.nidx, got, tc.want)
		}
		for maxRows := tc.nq; maxRows <= tc.nq+4; maxRows += 4 {
			if tc.H > 0 && MLAWorkspaceBytes(tc.nq, tc.H, got) > MLAWG2WorkspaceBytes(maxRows, tc.H) {
				t.Errorf("nq=%d H=%d: plan needs %d bytes, bound for %d rows %d", tc.nq, tc.H, MLAWorkspaceBytes(tc.nq, tc.H, got), maxRows, MLAWG2WorkspaceBytes(maxRows, tc.H))
			}
		}
	}
}

// The wide fp8 absorb kernels against float64 references: every block shape
// (columns a block, rows a warp), query rows past one staging chunk (8),
// GLM-5's nope 192 / vd 256, and the RoPE copy of absorb_q_fp8.
func TestKernelAbsorbFP8(t *testing.T) {
	onGPU(t, func(c *cuda.Ctx, k *Set, a *allocs, r *rand.Rand) {
		s := c.Stream()
		const R, P = 512, 64
		for _, sh := range []struct{ M, H, nope, vd int }{{1, 4, 32, 32}, {3, 5, 128, 48}, {12, 3, 128, 128}, {2, 8, 192, 256}} {
			M, H, nope, vd := sh.M, sh.H, sh.nope, sh.vd
			hs := nope + P
			ldq := H*hs + 4
			q := randF32(r, M*ldq, 1)
			wk := func(n int) (cuda.DevPtr, cuda.DevPtr, func(row, c int) float64) { return randFP8Rows(r, a, n, R) }
			ukp, uks, uk := wk(H * nope)
			ref := make([]float64, M*H*R)
			for m := range M {
				for h := range H {
					for col := range R {
						var acc float64
						for d := range nope {
							acc += uk(h*nope+d, col) * float64(q[m*ldq+h*hs+d])
						}
						ref[(m*H+h)*R+col] = acc
					}
				}
			}
			qp := a.up(q)
			// RoPE of the copied part: positions per row, random tables.
			const maxPos = 40
			pos := make([]int32, M)
			for i := range pos {
				pos[i] = int32(r.IntN(maxPos))
			}
			cosT, sinT := randF32(r, maxPos*P/2, 1), randF32(r, maxPos*P/2, 1)
			ropes := []QRope{{}, {Pos: a.up(pos), Cos: a.up(cosT), Sin: a.up(sinT)}, {Pos: a.up(pos), Cos: a.up(cosT), Sin: a.up(sinT), Interleaved: true}}
			for _, g := range []int{2, 4, 8} {
				if nope > 8*256/g {
					continue
				}
				out := a.poisoned(M * H * R)
				tag := fmt.Sprintf("M=%d H=%d nope=%d cols=%d", M, H, nope, 16*g)
				for ri, rp := range ropes {
					qpe := a.poisoned(M * H * P)
					chk(k.absorbQFP8(s, out, qpe, qp, ukp, uks, M, H, nope, R, ldq, hs, P, rp, g))
					if ri == 0 {
						record(t, "absorb_q_fp8 "+tag, relMetric, relErr(downF32(c, out, M*H*R), ref), boundF32)
					}
					gp := downF32(c, qpe, M*H*P)
					var want []float64
					var got []float32
					for m := range M {
						for h := range H {
							src := q[m*ldq+h*hs+nope:]
							for i := range P / 2 {
								i0, i1 := i, i+P/2
								if rp.Interleaved {
									i0, i1 = 2*i, 2*i+1
								}
								a, b := float64(src[i0]), float64(src[i1])
								if ri > 0 {
									cv, sv := float64(cosT[int(pos[m])*P/2+i]), float64(sinT[int(pos[m])*P/2+i])
									a, b = a*cv-b*sv, b*cv+a*sv
								}
								want = append(want, a, b)
								got = append(got, gp[(m*H+h)*P+i0], gp[(m*H+h)*P+i1])
							}
						}
					}
					record(t, fmt.Sprintf("absorb_q_fp8 RoPE part (rope %d) %s", ri, tag), relMetric, relErr(got, want), boundF32)
				}
			}

			x := randF32(r, M*H*R, 1)
			uvp, uvs, uv := wk(H * vd)
			ldo := H*vd + 3
			var refC []float64
			for m := range M {
				for h := range H {
					for v := range vd {
						var acc float64
						for col := range R {
							acc += uv(h*vd+v, col) * float64(x[(m*H+h)*R+col])
						}
						refC = append(refC, acc)
					}
				}
			}
			xp := a.up(x)
			for _, rw := range []int{1, 2, 4} {
				vo := a.poisoned(M * ldo)
				chk(k.absorbVFP8(s, vo, xp, uvp, uvs, M, H, vd, ldo, rw))
				vgot := downF32(c, vo, M*ldo)
				var gotC []float32
				pad := 0
				for m := range M {
					gotC = append(gotC, vgot[m*ldo:m*ldo+H*vd]...)
					for i := H * vd; i < ldo; i++ {
						if !math.IsNaN(float64(vgot[m*ldo+i])) {
							pad++
						}
					}
				}
				tag := fmt.Sprintf("M=%d H=%d vd=%d rows/warp=%d", M, H, vd, rw)
				record(t, "absorb_v_fp8 "+tag, relMetric, relErr(gotC, refC), boundF32)
				record(t, "absorb_v_fp8 padding untouched "+tag, "written values", float64(pad), 0)
			}
		}
	})
}

// The absorb kernels' block shapes: the widest (columns a block, rows a
// warp) that still gives each of the 132 SMs a block, at the real head
// counts and their TP-8 shards.
func TestAbsorbPlan(t *testing.T) {
	for _, tc := range []struct{ H, R, vd, g, rw, rwFast int }{
		{128, 512, 128, 8, 4, 4}, // DeepSeek-V3.2: 512 blocks each
		{64, 512, 256, 8, 4, 4},  // GLM-5
		{16, 512, 128, 2, 1, 2},  // DeepSeek TP-8 shard: 128 blocks at rw 2 (measured faster than 1)
		{8, 512, 256, 2, 1, 2},   // GLM-5 TP-8 shard: the same 128 blocks
		{4, 512, 128, 2, 1, 1},   // a 32-way shard: rw 2 would leave most SMs idle
	} {
		if g := absorbCols(132, tc.H, tc.R); g != tc.g {
			t.Errorf("absorbCols(H=%d) = %d, want %d", tc.H, g, tc.g)
		}
		if rw := absorbRows(132, tc.H, tc.vd); rw != tc.rw {
			t.Errorf("absorbRows(H=%d vd=%d) = %d, want %d", tc.H, tc.vd, rw, tc.rw)
		}
		if rw := absorbFastRows(132, tc.H, tc.vd); rw != tc.rwFast {
			t.Errorf("absorbFastRows(H=%d vd=%d) = %d, want %d", tc.H, tc.vd, rw, tc.rwFast)
		}
	}
}

// TestKernelAbsorbTC checks the tensor-core absorb products (absorb_tc in
// gemm_h2_absorb.cu) against float64 references on fresh random inputs:
// many rows (tails of the 64-row blocks), GLM-5's nope 192 (a K tail) and
// vd 256 (two column blocks), a vd of 48 (a column tail), padded strides,
// and query rows scaled apart by up to 2^+-30 (the per-row power of two).
func TestKernelAbsorbTC(t *testing.T) {
	onGPU(t, func(c *cuda.Ctx, k *Set, a *allocs, r *rand.Rand) {
		if !k.AbsorbTCOK(0, 512) {
			t.Skip("absorb_tc needs sm_89+")
		}
		s := c.Stream()
		const R, P = 512, 64
		for _, sh := range []struct{ M, H, nope, vd int }{{1, 4, 32, 32}, {70, 5, 128, 48}, {130, 3, 128, 128}, {65, 4, 192, 256}} {
			M, H, nope, vd := sh.M, sh.H, sh.nope, sh.vd
			hs := nope + P
			ldq := H*hs + 4
			q := randF32(r, M*ldq, 1)
			for m := range M {
				f := float32(math.Ldexp(1, r.IntN(61)-30))
				for i := range ldq {
					q[m*ldq+i] *= f
				}
			}
			wk := func(n int) (cuda.DevPtr, cuda.DevPtr, func(row, c int) float64) { return randFP8Rows(r, a, n, R) }
			ukp, uks, uk := wk(H * nope)
			ref := make([]float64, M*H*R)
			for m := range M {
				for h := range H {
					for col := range R {
						var acc float64
						for d := range nope {
							acc += uk(h*nope+d, col) * float64(q[m*ldq+h*hs+d])
						}
						ref[(m*H+h)*R+col] = acc
					}
				}
			}
			out := a.poisoned(M * H * R)
			chk(k.AbsorbQTC(s, out, a.up(q), ukp, uks, M, H, nope, R, ldq, hs))
			got := downF32(c, out, M*H*R)
			worst := 0.0
			for m := range M { // rows are scaled apart: each against its own size
				worst = max(worst, relErr(got[m*H*R:(m+1)*H*R], ref[m*H*R:(m+1)*H*R]))
			}
			record(t, fmt.Sprintf("absorb_tc q M=%d H=%d nope=%d (worst row)", M, H, nope), relMetric, worst, boundF32)

			x := randF32(r, M*H*R, 1)
			for m := range M {
				f := float32(math.Ldexp(1, r.IntN(61)-30))
				for i := range H * R {
					x[m*H*R+i] *= f
				}
			}
			uvp, uvs, uv := wk(H * vd)
			ldo := H*vd + 3
			refC := make([]float64, M*ldo)
			for m := range M {
				for h := range H {
					for v := range vd {
						var acc float64
						for col := range R {
							acc += uv(h*vd+v, col) * float64(x[(m*H+h)*R+col])
						}
						refC[m*ldo+h*vd+v] = acc
					}
				}
			}
			vo := a.poisoned(M * ldo)
			chk(k.AbsorbVTC(s, vo, a.up(x), uvp, uvs, M, H, vd, R, ldo))
			vgot := downF32(c, vo, M*ldo)
			worst = 0
			for m := range M {
				for i := H * vd; i < ldo; i++ {
					if vgot[m*ldo+i] == vgot[m*ldo+i] {
						t.Errorf("absorb_tc v wrote past H*vd at row %d col %d", m, i)
					}
					vgot[m*ldo+i] = 0
				}
				worst = max(worst, relErr(vgot[m*ldo:(m+1)*ldo], refC[m*ldo:(m+1)*ldo]))
			}
			record(t, fmt.Sprintf("absorb_tc v M=%d H=%d vd=%d ldo=%d (worst row)", M, H, vd, ldo), relMetric, worst, boundF32)
		}
	})
}
