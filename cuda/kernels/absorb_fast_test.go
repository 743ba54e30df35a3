package kernels

import (
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/tilert-go/tilert/cuda"
)

// TestKernelAbsorbFast checks the one-row absorb kernels (cu/absorb/
// absorb_fast.cu) on fresh random inputs: against float64 references, bit
// for bit against absorb_q_fp8 / absorb_v_fp8 (today's kernels) at every
// block shape, the RoPE part (none, half-split, interleaved) bit for bit,
// the padding after vd untouched, a repeat bit for bit, and that the
// launches ran. Shapes: DeepSeek-V3.2 (128 heads, nope 128, vd 128) and its
// TP-8 shard (16), GLM-5 (64 heads, nope 192, vd 256) and its shard (8),
// odd small ones (nope 32 / 200, vd 48).
func TestKernelAbsorbFast(t *testing.T) {
	onGPU(t, func(c *cuda.Ctx, k *Set, a *allocs, r *rand.Rand) {
		if err := k.AbsorbFastSupported(); err != nil {
			t.Skipf("absorb module: %v", err)
		}
		s := c.Stream()
		n0 := AbsorbFastLaunches.Load()
		const R, P = 512, 64
		for _, sh := range []struct{ H, nope, vd int }{{128, 128, 128}, {16, 128, 128}, {64, 192, 256}, {8, 192, 256}, {5, 32, 48}, {3, 200, 40}} {
			H, nope, vd := sh.H, sh.nope, sh.vd
			hs := nope + P
			q := randF32(r, H*hs+4, 1)
			wk := func(n int) (cuda.DevPtr, cuda.DevPtr, func(row, c int) float64) { return randFP8Rows(r, a, n, R) }
			ukp, uks, uk := wk(H * nope)
			ref := make([]float64, H*R)
			for h := range H {
				for col := range R {
					var acc float64
					for d := range nope {
						acc += uk(h*nope+d, col) * float64(q[h*hs+d])
					}
					ref[h*R+col] = acc
				}
			}
			qp := a.up(q)
			const maxPos = 40
			pos := []int32{int32(r.IntN(maxPos))}
			cosT, sinT := randF32(r, maxPos*P/2, 1), randF32(r, maxPos*P/2, 1)
			ropes := []QRope{{}, {Pos: a.up(pos), Cos: a.up(cosT), Sin: a.up(sinT)}, {Pos: a.up(pos), Cos: a.up(cosT), Sin: a.up(sinT), Interleaved: true}}
			gRule := absorbCols(c.Info().SMs, H, R)
			for _, g := range []int{2, 4, 8} {
				if nope > 8*256/g || R%(16*g) != 0 {
					continue
				}
				tag := fmt.Sprintf("H=%d nope=%d cols=%d", H, nope, 16*g)
				if g == gRule {
					tag += " (rule)"
				}
				for ri, rp := range ropes {
					out, qpe := a.poisoned(H*R), a.poisoned(H*P)
					oldOut, oldQpe := a.poisoned(H*R), a.poisoned(H*P)
					chk(k.absorbQFast(s, out, qpe, qp, ukp, uks, H, nope, R, hs, P, rp, QScale{}, g))
					chk(k.absorbQFP8(s, oldOut, oldQpe, qp, ukp, uks, 1, H, nope, R, H*hs, hs, P, rp, g))
					got, gq := downF32(c, out, H*R), downF32(c, qpe, H*P)
					if ri == 0 {
						record(t, "absorb_q_fast "+tag, relMetric, relErr(got, ref), boundF32)
					}
					record(t, fmt.Sprintf("absorb_q_fast == absorb_q_fp8 (rope %d) %s", ri, tag), "differing values",
						float64(diffF32Bits(got, downF32(c, oldOut, H*R))+diffF32Bits(gq, downF32(c, oldQpe, H*P))), 0)
					var want []float64
					var gotP []float32
					for h := range H {
						src := q[h*hs+nope:]
						for i := range P / 2 {
							i0, i1 := i, i+P/2
							if rp.Interleaved {
								i0, i1 = 2*i, 2*i+1
							}
							x, y := float64(src[i0]), float64(src[i1])
							if ri > 0 {
								cv, sv := float64(cosT[int(pos[0])*P/2+i]), float64(sinT[int(pos[0])*P/2+i])
								x, y = x*cv-y*sv, y*cv+x*sv
							}
							want = append(want, x, y)
							gotP = append(gotP, gq[h*P+i0], gq[h*P+i1])
						}
					}
					record(t, fmt.Sprintf("absorb_q_fast RoPE part (rope %d) %s", ri, tag), relMetric, relErr(gotP, want), boundF32)
					if ri == 1 { // repeat
						chk(k.absorbQFast(s, out, qpe, qp, ukp, uks, H, nope, R, hs, P, rp, QScale{}, g))
						record(t, "absorb_q_fast repeat "+tag, "differing values",
							float64(diffF32Bits(got, downF32(c, out, H*R))+diffF32Bits(gq, downF32(c, qpe, H*P))), 0)
					}
				}
				// No RoPE part (qpe = 0): the product alone.
				out := a.poisoned(H * R)
				chk(k.absorbQFast(s, out, 0, qp, ukp, uks, H, nope, R, hs, 0, QRope{}, QScale{}, g))
				record(t, "absorb_q_fast without qpe "+tag, relMetric, relErr(downF32(c, out, H*R), ref), boundF32)
			}

			x := randF32(r, H*R, 1)
			uvp, uvs, uv := wk(H * vd)
			var refC []float64
			for h := range H {
				for v := range vd {
					var acc float64
					for col := range R {
						acc += uv(h*vd+v, col) * float64(x[h*R+col])
					}
					refC = append(refC, acc)
				}
			}
			xp := a.up(x)
			old := a.poisoned(H * vd)
			chk(k.absorbVFP8(s, old, xp, uvp, uvs, 1, H, vd, H*vd, absorbRows(c.Info().SMs, H, vd)))
			oldC := downF32(c, old, H*vd)
			for _, rw := range []int{1, 2, 4, 8} {
				const pad = 5
				vo := a.poisoned(H*vd + pad)
				chk(k.absorbVFast(s, vo, xp, uvp, uvs, H, vd, R, rw))
				all := downF32(c, vo, H*vd+pad)
				got := all[:H*vd]
				tag := fmt.Sprintf("H=%d vd=%d rows/warp=%d", H, vd, rw)
				record(t, "absorb_v_fast "+tag, relMetric, relErr(got, refC), boundF32)
				record(t, "absorb_v_fast == absorb_v_fp8 "+tag, "differing values", float64(diffF32Bits(got, oldC)), 0)
				written := 0
				for _, v := range all[H*vd:] {
					if !math.IsNaN(float64(v)) {
						written++
					}
				}
				record(t, "absorb_v_fast padding untouched "+tag, "written values", float64(written), 0)
				if rw == 4 {
					chk(k.absorbVFast(s, vo, xp, uvp, uvs, H, vd, R, rw))
					record(t, "absorb_v_fast repeat "+tag, "differing values", float64(diffF32Bits(got, downF32(c, vo, H*vd))), 0)
				}
			}
		}
		if AbsorbFastLaunches.Load() == n0 {
			t.Fatal("no one-row absorb launch was counted")
		}
	})
}

// TestAbsorbFastKernels: the host-side shape rules name kernels the module
// defines (with the register bound the rule needs), refuse shapes no
// kernel takes, and the main module holds none of them.
func TestAbsorbFastKernels(t *testing.T) {
	src := AbsorbKernelSource()
	if strings.Contains(KernelSource(), "absorb_q_fast") || strings.Contains(KernelSource(), "absorb_v_fast") {
		t.Errorf("the main module holds one-row absorb kernels: they belong to the absorb module")
	}
	for _, tc := range []struct {
		g, nope int
		want    string
	}{
		{8, 128, "absorb_q_fast_g8_r4"}, {8, 192, "absorb_q_fast_g8_r8"}, {8, 256, "absorb_q_fast_g8_r8"}, {8, 257, ""},
		{4, 128, "absorb_q_fast_g4_r4"}, {4, 256, "absorb_q_fast_g4_r4"}, {2, 128, "absorb_q_fast_g2_r4"}, {16, 128, ""}, {3, 64, ""},
		{4, 300, ""}, {2, 600, ""}, // past AbsorbQFastOK's 256 rows: no kernel (g4_r8, g2_r8 were removed)
	} {
		if got := absorbQFastKernel(tc.g, tc.nope); got != tc.want {
			t.Errorf("absorbQFastKernel(%d, %d) = %q, want %q", tc.g, tc.nope, got, tc.want)
		}
	}
	// Exactly the kernels absorbQFastKernel can name over AbsorbQFastOK's
	// rows are defined (plain and _n), each with its blocks an SM.
	names := map[string]bool{}
	for _, g := range []int{2, 4, 8} {
		for nope := 1; nope <= 256; nope++ {
			names[absorbQFastKernel(g, nope)] = true
		}
	}
	for _, g := range []int{2, 4, 8} {
		for _, nr := range []int{4, 8} {
			minb := map[int]int{4: 4, 8: 2}[nr]
			want := names[fmt.Sprintf("absorb_q_fast_g%d_r%d", g, nr)]
			for _, m := range []string{"ABSORB_Q_FAST", "ABSORB_Q_FAST_N"} {
				if has := strings.Contains(src, fmt.Sprintf("%s(%d, %d, %d)", m, g, nr, minb)); has != want {
					t.Errorf("%s(%d, %d, %d) defined: %v, want %v (absorbQFastKernel names it)", m, g, nr, minb, has, want)
				}
				if strings.Contains(src, fmt.Sprintf("%s(%d, %d,", m, g, nr)) && !want {
					t.Errorf("%s(%d, %d, ...) defined: no launch names it", m, g, nr)
				}
			}
		}
	}
	if len(names) != 4 {
		t.Errorf("absorbQFastKernel names %d kernels over nope 1..256, want 4 (g2_r4, g4_r4, g8_r4, g8_r8): %v", len(names), names)
	}
	// rows a warp -> blocks an SM its bound asks for (2: 32 registers, all
	// 1024 blocks of 128 heads resident on 132 SMs).
	for rw, minb := range map[int]int{1: 4, 2: 8, 4: 4, 8: 2} {
		name := absorbVFastKernel(rw)
		if name != fmt.Sprintf("absorb_v_fast_rw%d", rw) || !strings.Contains(src, fmt.Sprintf("ABSORB_V_FAST(%d, %d)", rw, minb)) {
			t.Errorf("rows a warp %d: %q not defined", rw, name)
		}
	}
	if absorbVFastKernel(3) != "" || absorbVFastKernel(16) != "" {
		t.Errorf("absorbVFastKernel takes rows a warp it has no kernel for")
	}
	// DeepSeek-V3.2 and its TP-8 shard, GLM-5 and its shard: the rule's
	// block shapes all have a kernel.
	for _, tc := range []struct{ H, nope, vd int }{{128, 128, 128}, {16, 128, 128}, {64, 192, 256}, {8, 192, 256}} {
		if absorbQFastKernel(absorbCols(132, tc.H, 512), tc.nope) == "" || absorbVFastKernel(absorbRows(132, tc.H, tc.vd)) == "" {
			t.Errorf("H=%d nope=%d vd=%d: no one-row kernel for the rule's shape", tc.H, tc.nope, tc.vd)
		}
	}
	if !AbsorbQFastOK(128, 512, 192, 64, true) || AbsorbQFastOK(128, 512, 160, 64, true) || AbsorbQFastOK(128, 500, 192, 64, true) ||
		AbsorbQFastOK(300, 512, 364, 64, true) || AbsorbQFastOK(128, 512, 192, 63, true) || !AbsorbQFastOK(128, 512, 128, 0, false) {
		t.Errorf("AbsorbQFastOK's conditions")
	}
}

// TestNVRTCCompilesAbsorbKernels compiles the absorb module for sm_90 (no
// GPU needed).
func TestNVRTCCompilesAbsorbKernels(t *testing.T) {
	nv, err := cuda.LoadNVRTC()
	if err != nil {
		t.Skipf("no NVRTC here, compile check skipped: %v", err)
	}
	ck, err := CompileAbsorb(nv, 9, 0, cuda.KernelCache{Dir: t.TempDir()})
	if err != nil {
		t.Fatalf("%+v", err)
	}
	if len(ck.Image) < 1000 {
		t.Fatalf("image %d bytes", len(ck.Image))
	}
	t.Logf("NVRTC %s: absorb module for %s in %v, %d bytes", nv.Version(), ck.Arch, ck.Took, len(ck.Image))
}

// TestKernelAbsorbFastTiming (TILERT_GPU_TIMING=1) times one row of the
// absorb products, weights cold, graph-timed: a device-to-device copy of
// the same bytes, today's kernels (absorb_q_fp8 / absorb_v_fp8), the
// one-row kernels at the rule's shape, then a sweep of columns a block
// (absorb_q: 16*G; G other than the rule's changes the sums' order) and
// rows a warp (absorb_v: every choice the same bits). DeepSeek-V3.2's 128
// heads and the 16 of its TP-8 shard. Reported, never asserted.
func TestKernelAbsorbFastTiming(t *testing.T) {
	needTiming(t)
	onGPU(t, func(c *cuda.Ctx, k *Set, a *allocs, r *rand.Rand) {
		if err := k.AbsorbFastSupported(); err != nil {
			t.Skipf("absorb module: %v", err)
		}
		add := timingTable(t, c, a, r, 1<<30, "absorb: device-to-device copy 1 GiB (read+write)", "reference")
		const R, P, nope, vd = 512, 64, 128, 128
		hs := nope + P
		sms := c.Info().SMs
		for _, H := range []int{128, 16} {
			wbytes := int64(H * nope * R)
			sbytes := int64(4 * H * nope * R / 128)
			nc := coldCopies(wbytes + sbytes)
			ws, ss := make([]cuda.DevPtr, nc), make([]cuda.DevPtr, nc)
			for i := range nc {
				ws[i], ss[i] = a.raw(wbytes), a.raw(sbytes)
				fillRandom(c, r, ws[i], wbytes, "fp8")
				fillRandom(c, r, ss[i], sbytes, "f32")
			}
			q := a.up(randF32(r, H*hs, 1))
			x := a.up(randF32(r, H*R, 1))
			out, qpe, vo := a.raw(int64(4*H*R)), a.raw(int64(4*H*P)), a.raw(int64(4*H*vd))
			pos := a.up([]int32{7})
			cosT, sinT := a.up(randF32(r, 16*P/2, 1)), a.up(randF32(r, 16*P/2, 1))
			rope := QRope{Pos: pos, Cos: cosT, Sin: sinT}
			b := float64(wbytes + sbytes)
			half := ((wbytes + sbytes) / 2) &^ 255
			srcs := make([]cuda.DevPtr, nc)
			for i := range srcs {
				srcs[i] = a.raw(half)
			}
			dst := a.raw(half)
			cp := groupGraphUs(c, 2*nc, 11, func(s cuda.Stream, i int) { chk(c.CopyDtoD(dst, srcs[i%nc], half, s)) })
			add(fmtName("absorb H=%d: d2d copy of the same bytes, cold, graph", H), float64(2*half), cp, "floor for this size")
			g := absorbCols(sms, H, R)
			oq := groupGraphUs(c, 2*nc, 11, func(s cuda.Stream, i int) {
				chk(k.AbsorbQFP8(s, out, qpe, q, ws[i%nc], ss[i%nc], 1, H, nope, R, H*hs, hs, P, rope))
			})
			add(fmtName("absorbQ H=%d: absorb_q_fp8 (today), cold, graph", H), b, oq, fmtName("%.2fx copy time", oq/cp))
			nq := groupGraphUs(c, 2*nc, 11, func(s cuda.Stream, i int) {
				chk(k.AbsorbQFast(s, out, qpe, q, ws[i%nc], ss[i%nc], H, nope, R, hs, P, rope))
			})
			add(fmtName("absorbQ H=%d: %s (rule), cold, graph", H, absorbQFastKernel(g, nope)), b, nq, fmtName("%.2fx today, %.2fx copy time", oq/nq, nq/cp))
			ov := groupGraphUs(c, 2*nc, 11, func(s cuda.Stream, i int) {
				chk(k.AbsorbVFP8(s, vo, x, ws[i%nc], ss[i%nc], 1, H, vd, R, H*vd))
			})
			add(fmtName("absorbV H=%d: absorb_v_fp8 (today), cold, graph", H), b, ov, fmtName("%.2fx copy time", ov/cp))
			nv := groupGraphUs(c, 2*nc, 11, func(s cuda.Stream, i int) {
				chk(k.AbsorbVFast(s, vo, x, ws[i%nc], ss[i%nc], H, vd, R, 0))
			})
			add(fmtName("absorbV H=%d: %s (rule), cold, graph", H, absorbVFastKernel(absorbRows(sms, H, vd))), b, nv, fmtName("%.2fx today, %.2fx copy time", ov/nv, nv/cp))
			both := groupGraphUs(c, 2*nc, 11, func(s cuda.Stream, i int) {
				chk(k.AbsorbQFP8(s, out, qpe, q, ws[i%nc], ss[i%nc], 1, H, nope, R, H*hs, hs, P, rope))
				chk(k.AbsorbVFP8(s, vo, x, ws[(i+1)%nc], ss[(i+1)%nc], 1, H, vd, R, H*vd))
			})
			bothFast := groupGraphUs(c, 2*nc, 11, func(s cuda.Stream, i int) {
				chk(k.AbsorbQFast(s, out, qpe, q, ws[i%nc], ss[i%nc], H, nope, R, hs, P, rope))
				chk(k.AbsorbVFast(s, vo, x, ws[(i+1)%nc], ss[(i+1)%nc], H, vd, R, 0))
			})
			add(fmtName("absorbQ + absorbV H=%d: today, cold, graph", H), 2*b, both, "")
			add(fmtName("absorbQ + absorbV H=%d: one-row kernels, cold, graph", H), 2*b, bothFast, fmtName("%.2fx today", both/bothFast))
			var sw strings.Builder
			fmt.Fprintf(&sw, "H=%d (copy %.2f us) q: today %.2f |", H, cp, oq)
			for _, gg := range []int{2, 4, 8} {
				us := groupGraphUs(c, 2*nc, 11, func(s cuda.Stream, i int) {
					chk(k.absorbQFast(s, out, qpe, q, ws[i%nc], ss[i%nc], H, nope, R, hs, P, rope, QScale{}, gg))
				})
				fmt.Fprintf(&sw, " G=%d:%.2f", gg, us)
			}
			us := groupGraphUs(c, 2*nc, 11, func(s cuda.Stream, i int) {
				chk(k.absorbQFast(s, out, 0, q, ws[i%nc], ss[i%nc], H, nope, R, hs, 0, QRope{}, QScale{}, g))
			})
			fmt.Fprintf(&sw, " rule without qpe:%.2f | v: today %.2f |", us, ov)
			for _, rw := range []int{1, 2, 4, 8} {
				us := groupGraphUs(c, 2*nc, 11, func(s cuda.Stream, i int) {
					chk(k.absorbVFast(s, vo, x, ws[i%nc], ss[i%nc], H, vd, R, rw))
				})
				fmt.Fprintf(&sw, " rw=%d:%.2f", rw, us)
			}
			t.Logf("sweep absorb graph us: %s", sw.String())
		}
	})
}
