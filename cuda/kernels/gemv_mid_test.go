package kernels

import (
	"fmt"
	"math"
	"math/rand/v2"
	"sort"
	"strings"
	"testing"

	"github.com/tilert-go/tilert/cuda"
)

// midShapes are GroupMidShapes' names in a fixed order.
func midShapes() []string {
	var out []string
	for n := range GroupMidShapes {
		out = append(out, n)
	}
	sort.Strings(out)
	return out
}

// TestKernelGemvGroupMid checks every gemv_mid_group variant and its _n
// twin (one input row; fp8 and bf16 segments, odd row counts, partial scale
// blocks, padded x, with and without the norm prologue) against the float64
// reference on fresh random inputs, against the default grouped launch
// (GemvGroup) bit for bit, and run to run bit for bit, at the decode shapes
// (the layer input's four projections, q_b + wq_b) and odd ones, with the
// rule's group sizes and with G pinned to 32 (the K = 1536 sweep's
// candidate). It fails unless the mid kernel ran where it applies.
func TestKernelGemvGroupMid(t *testing.T) {
	defer func() { forceTileG = 0 }()
	onGPU(t, func(c *cuda.Ctx, k *Set, a *allocs, r *rand.Rand) {
		s := c.Stream()
		for _, gc := range []groupCase{
			{K: 7168, M: 1, segs: []groupSegCase{{1536, false}, {576, false}, {128, false}, {64, true}}},
			{K: 1536, M: 1, segs: []groupSegCase{{24576, false}, {8192, false}}},
			// q_b + wq_b over the raw q_a with q_a's norm in the prologue.
			{K: 1536, M: 1, norm: true, segs: []groupSegCase{{24576, false}, {8192, false}}},
			{K: 7168, M: 1, norm: true, segs: []groupSegCase{{1536, false}, {576, false}, {128, false}, {64, true}}},
			{K: 1040, M: 1, pad: 4, norm: true, segs: []groupSegCase{{130, false}, {7, true}}},
			{K: 96, M: 1, norm: true, segs: []groupSegCase{{300, false}}},
			{K: 2048, M: 1, pad: 4, segs: []groupSegCase{{301, false}, {77, true}, {130, false}}},
			{K: 1040, M: 1, pad: 8, segs: []groupSegCase{{5, false}, {131, true}, {1, false}}},
			{K: 512, M: 1, segs: []groupSegCase{{1, false}}},
			{K: 16, M: 1, segs: []groupSegCase{{33, false}, {9, true}}},
		} {
			K, M := gc.K, gc.M
			ldx := K + gc.pad
			x := randF32(r, M*ldx, 1)
			xp := a.up(x)
			var norm GroupNorm
			xref := x
			xn := xp // RMSNorm's output, for the launch without the prologue
			if gc.norm {
				nw := randF32(r, K, 1)
				norm = GroupNorm{W: a.up(nw), Eps: 1e-6}
				xn = a.poisoned(ldx)
				chk(k.RMSNorm(s, xn, xp, norm.W, 1, K, ldx, ldx, norm.Eps))
				xref = make([]float32, M*ldx)
				var ss float64
				for i := range K {
					v := float64(x[i])
					ss += v * v
				}
				inv := 1 / math.Sqrt(ss/float64(K)+float64(norm.Eps))
				for i := range K {
					xref[i] = float32(float64(x[i]) * inv * float64(nw[i]))
				}
			}
			segs := make([]GroupSeg, len(gc.segs))
			refs := make([][]float64, len(gc.segs))
			for i, sc := range gc.segs {
				N := sc.N
				sg := GroupSeg{N: N, LdY: N + 3, BF16: sc.bf16}
				if sc.bf16 {
					w := randBF16(r, N*K, 0.05)
					sg.W = a.up(w)
					refs[i] = refGemv(func(n, kk int) float64 { return bf16ToF64(w[n*K+kk]) }, xref, nil, N, K, M, ldx, sg.LdY)
				} else {
					w := randFP8(r, N*K)
					scl := randScales(r, cdiv(N, 128)*cdiv(K, 128), -8)
					sg.W, sg.S = a.up(w), a.up(scl)
					refs[i] = refGemv(fp8At(w, scl, K), xref, nil, N, K, M, ldx, sg.LdY)
				}
				segs[i] = sg
			}
			outs := func(f func() error) [][]float32 {
				for i := range segs {
					segs[i].Y = a.poisoned(M * segs[i].LdY)
				}
				chk(f())
				var o [][]float32
				for _, sg := range segs {
					o = append(o, rowsOf(downF32(c, sg.Y, M*sg.LdY), M, sg.N, sg.LdY))
				}
				return o
			}
			rows := 0
			for _, sc := range gc.segs {
				rows += sc.N
			}
			for _, fg := range []int{0, 32} {
				if fg != 0 && rows > 10000 {
					continue // the q_b-sized cases at the rule's G only (time); the small ones cover G = 32's rounds
				}
				forceTileG = fg
				def := outs(func() error { return k.GemvGroup(s, xp, K, M, ldx, segs, norm) })
				sep := def
				if gc.norm {
					sep = outs(func() error { return k.GemvGroup(s, xn, K, M, ldx, segs, GroupNorm{}) })
				}
				for _, shape := range midShapes() {
					var ran [2]bool
					var runs [2][][]float32
					for run := range runs {
						runs[run] = outs(func() error {
							var err error
							ran[run], err = k.GemvGroupMid(s, xp, K, M, ldx, segs, norm, shape)
							return err
						})
					}
					tag := fmt.Sprintf("%s K=%d ldx=%d norm=%v G=%d", groupMidKernel(shape), K, ldx, gc.norm, fg)
					record(t, tag+" ran", "launches not on the mid kernel", float64(2-b2i(ran[0])-b2i(ran[1])), 0)
					for i, sg := range segs {
						name := fmt.Sprintf("%s seg %d/%d N=%d bf16=%v", tag, i, len(segs), sg.N, sg.BF16)
						record(t, name, relMetric, relErr(runs[0][i], rowsOf64(refs[i], M, sg.N, sg.LdY)), boundF32)
						record(t, name+" vs gemv_group", "differing outputs", float64(diffCount(runs[0][i], def[i])), 0)
						if gc.norm {
							record(t, name+" vs rmsnorm + gemv_group", "differing outputs", float64(diffCount(runs[0][i], sep[i])), 0)
						}
						record(t, name+" repeat", "differing outputs", float64(diffCount(runs[0][i], runs[1][i])), 0)
					}
				}
			}
			forceTileG = 0
		}
		// Where it does not apply it is GemvGroup: 2 rows (with and without
		// a norm), an unknown shape.
		w := a.up(randFP8(r, 64*64))
		sc := a.up(randScales(r, 1, -8))
		xb := a.up(randF32(r, 64*2, 1))
		nw := a.up(randF32(r, 64, 1))
		y := a.poisoned(64 * 2)
		for _, bad := range []struct {
			M     int
			shape string
			norm  GroupNorm
		}{{2, GroupMidDefault, GroupNorm{}}, {1, "r3_d16", GroupNorm{}}, {1, "", GroupNorm{}}, {2, GroupMidDefault, GroupNorm{W: nw, Eps: 1e-6}}} {
			ran, err := k.GemvGroupMid(s, xb, 64, bad.M, 64, []GroupSeg{{W: w, S: sc, Y: y, N: 64, LdY: 64}}, bad.norm, bad.shape)
			chk(err)
			if ran {
				t.Errorf("GemvGroupMid(M=%d, shape %q, norm %v) ran the mid kernel", bad.M, bad.shape, bad.norm.W != 0)
			}
		}
	})
}

// TestGroupMidKernelsDefined: every GroupMidShapes variant is defined in the
// mid module's source with its rows per group and loads a round, the
// default is one of them, and the main module holds none of them (no GPU
// needed).
func TestGroupMidKernelsDefined(t *testing.T) {
	src := MidKernelSource()
	if _, ok := GroupMidShapes[GroupMidDefault]; !ok {
		t.Errorf("GroupMidDefault %q is not a shape", GroupMidDefault)
	}
	if strings.Contains(KernelSource(), "gemv_mid_") {
		t.Errorf("the main module holds gemv_mid kernels: they belong to the mid module")
	}
	for name, R := range GroupMidShapes {
		fn := groupMidKernel(name) + "("
		i := strings.Index(src, fn)
		if i < 0 {
			t.Errorf("%s not defined", fn)
			continue
		}
		if !strings.HasPrefix(name, fmt.Sprintf("r%d_", R)) {
			t.Errorf("shape %s: R=%d", name, R)
		}
		ld, mb := 8, 4
		if strings.HasSuffix(name, "_d16") {
			ld, mb = 16, 2
		}
		body := src[i:]
		if j := strings.Index(body, "extern"); j > 0 {
			body = body[:j]
		}
		if want := fmt.Sprintf("__launch_bounds__(MID_THREADS, %d)", mb); !strings.Contains(src[max(0, i-80):i], want) {
			t.Errorf("%s: not %s", fn, want)
		}
		if want := fmt.Sprintf("gemv_mid_run<%d, %d, false>", R, ld); !strings.Contains(body, want) {
			t.Errorf("%s does not run %s", fn, want)
		}
		// The norm twin.
		fnn := groupMidKernel(name) + "n("
		j := strings.Index(src, fnn)
		if j < 0 {
			t.Errorf("%s not defined", fnn)
			continue
		}
		bodyn := src[j:]
		if e := strings.Index(bodyn, "extern"); e > 0 {
			bodyn = bodyn[:e]
		}
		if want := fmt.Sprintf("gemv_mid_run<%d, %d, true>", R, ld); !strings.Contains(bodyn, want) {
			t.Errorf("%s does not run %s", fnn, want)
		}
		if want := fmt.Sprintf("__launch_bounds__(MID_THREADS, %d)", mb); !strings.Contains(src[max(0, j-80):j], want) {
			t.Errorf("%s: not %s", fnn, want)
		}
	}
}

// TestNVRTCCompilesMidKernels compiles the mid module with this machine's
// NVRTC for sm_90 (no GPU needed).
func TestNVRTCCompilesMidKernels(t *testing.T) {
	nv, err := cuda.LoadNVRTC()
	if err != nil {
		t.Skipf("no NVRTC here, compile check skipped: %v", err)
	}
	ck, err := CompileMid(nv, 9, 0, cuda.KernelCache{Dir: t.TempDir()})
	if err != nil {
		t.Fatalf("%+v", err)
	}
	if len(ck.Image) < 1000 {
		t.Fatalf("image %d bytes", len(ck.Image))
	}
	t.Logf("NVRTC %s: mid module for %s (cubin %v) in %v, %d bytes", nv.Version(), ck.Arch, ck.Cubin, ck.Took, len(ck.Image))
}

// TestKernelGroupMidTiming (TILERT_GPU_TIMING=1) times, weights cold,
// graph-timed (a decode step's launch gaps), one input row: a
// device-to-device copy of the same bytes, today's launches (the tile GEMV
// alone; the default grouped launch) and every gemv_mid_group shape, then
// logs a sweep of shape x group size G (G other than the rule's changes the
// summation order: the engine keeps the rule's). Reported, never asserted.
//
//   - in: q_a 1536, kv_a 576, indexer wk 128 (fp8) and weights_proj 64
//     (bf16) x 7168 of the layer input (16.5 MB);
//   - qb: q_b 24576 and indexer wq_b 8192 x 1536 (50.3 MB), with q_a's
//     norm (rmsnorm + two tile GEMVs, today's, against one launch that
//     norms in its prologue: TILERT_GPU_GEMV_MID=1; or rmsnorm + one
//     launch: =2) and without it;
//   - q_b alone, wq_b alone.
func TestKernelGroupMidTiming(t *testing.T) {
	needTiming(t)
	defer func() { forceTileG = 0 }()
	onGPU(t, func(c *cuda.Ctx, k *Set, a *allocs, r *rand.Rand) {
		add := timingTable(t, c, a, r, 1<<30, "mid: device-to-device copy 1 GiB (read+write)", "reference")
		type seg struct {
			N    int
			bf16 bool
		}
		run := func(what string, K int, norm bool, segs []seg) {
			var bytes int64
			for _, sg := range segs {
				bytes += int64(sg.N*K) * int64(1+b2i(sg.bf16))
			}
			nc := coldCopies(bytes)
			ws := make([][]cuda.DevPtr, len(segs))
			ss := make([][]cuda.DevPtr, len(segs))
			ys := make([]cuda.DevPtr, len(segs))
			for i, sg := range segs {
				if sg.bf16 {
					ws[i] = devBF16s(c, a, r, nc, sg.N, K)
					ss[i] = make([]cuda.DevPtr, nc)
				} else {
					ws[i], ss[i] = devFP8s(c, a, r, nc, sg.N, K)
				}
				ys[i] = a.raw(int64(4 * sg.N))
			}
			x := a.up(randF32(r, K, 1))
			nw := a.up(randF32(r, K, 1))
			xn := a.raw(int64(4 * K))
			gnorm := GroupNorm{}
			if norm {
				gnorm = GroupNorm{W: nw, Eps: 1e-6}
			}
			gsegs := func(i int) []GroupSeg {
				gs := make([]GroupSeg, len(segs))
				for j, sg := range segs {
					gs[j] = GroupSeg{W: ws[j][i%nc], S: ss[j][i%nc], Y: ys[j], N: sg.N, LdY: sg.N, BF16: sg.bf16}
				}
				return gs
			}
			b := float64(bytes) + float64(4*K)
			// The copy: bytes/2 read and bytes/2 written (the GEMV's traffic), sources cycled cold.
			half := (bytes / 2) &^ 255
			srcs := make([]cuda.DevPtr, nc)
			for i := range srcs {
				srcs[i] = a.raw(half)
			}
			dst := a.raw(half)
			cp := groupGraphUs(c, 2*nc, 11, func(s cuda.Stream, i int) { chk(c.CopyDtoD(dst, srcs[i%nc], half, s)) })
			add(fmtName("%s: d2d copy of the same bytes, cold, graph", what), float64(2*half), cp, "floor for this size")
			// With norm, "today" is RMSNorm then the separate launches over
			// its output; the grouped launches take the raw row and norm it
			// in their prologue, or (the "rmsnorm +" rows) follow RMSNorm.
			xx := x
			if norm {
				xx = xn
			}
			rms := func(s cuda.Stream) {
				if norm {
					chk(k.RMSNorm(s, xn, x, nw, 1, K, K, K, 1e-6))
				}
			}
			tile := groupGraphUs(c, 2*nc, 11, func(s cuda.Stream, i int) {
				rms(s)
				for j, sg := range segs {
					if sg.bf16 {
						chk(k.GemvBF16Wide(s, ys[j], xx, ws[j][i%nc], 0, sg.N, K, 1, K, sg.N))
					} else {
						chk(k.GemvFP8Tile(s, ys[j], xx, ws[j][i%nc], ss[j][i%nc], 0, sg.N, K, 1, K, sg.N))
					}
				}
			})
			add(fmtName("%s: separate tile launches, cold, graph", what), b, tile, fmtName("%d launches; %.2fx copy time", len(segs)+b2i(norm), tile/cp))
			def := groupGraphUs(c, 2*nc, 11, func(s cuda.Stream, i int) { chk(k.GemvGroup(s, x, K, 1, K, gsegs(i), gnorm)) })
			add(fmtName("%s: gemv_group (default kernel), cold, graph", what), b, def, fmtName("%.2fx separate", tile/def))
			for _, shape := range midShapes() {
				us := groupGraphUs(c, 2*nc, 11, func(s cuda.Stream, i int) {
					_, err := k.GemvGroupMid(s, x, K, 1, K, gsegs(i), gnorm, shape)
					chk(err)
				})
				n := groupMidKernel(shape) + map[bool]string{false: "", true: "n (norm prologue)"}[norm]
				add(fmtName("%s: %s, cold, graph", what, n), b, us, fmtName("%.2fx separate, %.2fx gemv_group", tile/us, def/us))
			}
			if norm {
				us := groupGraphUs(c, 2*nc, 11, func(s cuda.Stream, i int) { rms(s); chk(k.GemvGroup(s, xn, K, 1, K, gsegs(i), GroupNorm{})) })
				add(fmtName("%s: rmsnorm + gemv_group (GROUP=3), cold, graph", what), b, us, fmtName("%.2fx separate", tile/us))
				us = groupGraphUs(c, 2*nc, 11, func(s cuda.Stream, i int) {
					rms(s)
					_, err := k.GemvGroupMid(s, xn, K, 1, K, gsegs(i), GroupNorm{}, GroupMidDefault)
					chk(err)
				})
				add(fmtName("%s: rmsnorm + %s (GEMV_MID=2), cold, graph", what, groupMidKernel(GroupMidDefault)), b, us, fmtName("%.2fx separate", tile/us))
			}
			line := ""
			for _, fg := range []int{0, 32, 64, 128, 256} {
				forceTileG = fg
				line += fmt.Sprintf(" | G=%d group:%.2f", fg, groupGraphUs(c, 2*nc, 5, func(s cuda.Stream, i int) {
					chk(k.GemvGroup(s, x, K, 1, K, gsegs(i), gnorm))
				}))
				for _, shape := range midShapes() {
					line += fmt.Sprintf(" %s:%.2f", shape, groupGraphUs(c, 2*nc, 5, func(s cuda.Stream, i int) {
						_, err := k.GemvGroupMid(s, x, K, 1, K, gsegs(i), gnorm, shape)
						chk(err)
					}))
				}
			}
			forceTileG = 0
			t.Logf("sweep %s graph us (copy %.2f):%s", what, cp, line)
		}
		run("attn in 2304x7168", 7168, false, []seg{{1536, false}, {576, false}, {128, false}, {64, true}})
		run("q_b + wq_b 32768x1536 with q_a's norm", 1536, true, []seg{{24576, false}, {8192, false}})
		run("q_b + wq_b 32768x1536", 1536, false, []seg{{24576, false}, {8192, false}})
		run("q_b 24576x1536", 1536, false, []seg{{24576, false}})
		run("idx wq_b 8192x1536", 1536, false, []seg{{8192, false}})
	})
}
