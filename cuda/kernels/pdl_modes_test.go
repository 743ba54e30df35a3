package kernels

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/tilert-go/tilert/cuda"
)

// TestKernelPDLModesBitwise: every weight-streaming kernel that has the
// mode-2 prologue (tile GEMVs fp8 and bf16, capped grid, paired gate/up,
// routed experts with the shared one as a dense slot, both directions, and
// the grouped GEMV), each right after a small kernel that writes its input
// (poisoned before, so a read before the wait would show), launched in
// every PDL mode (0 plain, 1 trigger at the top, 2 weight prefetch + late
// trigger, 3 late trigger alone, 4 and 5: 3 and 2 with only these kernels
// launched programmatically), eagerly and as a graph: all outputs must be
// byte for byte the plain launches'.
func TestKernelPDLModesBitwise(t *testing.T) {
	onGPU(t, func(c *cuda.Ctx, k *Set, a *allocs, r *rand.Rand) {
		if !k.PDLSupported() {
			t.Log("no programmatic launches on this device: nothing to compare")
			return
		}
		prevMode := k.PDLMode()
		defer func() { chk(k.SetPDLMode(prevMode)) }()
		s := c.Stream()
		const H, QL, O, I, E, top = 7168, 1536, 16384, 2048, 4, 8
		in := func(n int) cuda.DevPtr { return a.up(randF32(r, n, 1)) }
		nw := func(n int) cuda.DevPtr { return a.up(randF32(r, n, 0.5)) }
		inQ, inH, inO := in(QL), in(H), in(O)
		inH4, inO4 := in(4*H), in(4*O)
		xh4, xo4 := a.raw(4*4*H), a.raw(4*4*O)
		nwQ, nwH, nwO := nw(QL), nw(H), nw(O)
		xq, xh, xh2, xh3, xo, xb := a.raw(4*QL), a.raw(4*H), a.raw(4*H), a.raw(4*H), a.raw(4*O), a.raw(4*H)
		wqb, sqb := devFP8(c, a, r, 24576, QL)
		wo, so := devFP8(c, a, r, H, O)
		wqa, sqa := devFP8(c, a, r, QL, H)
		wkv, skv := devFP8(c, a, r, 576, H)
		wk, sk := devFP8(c, a, r, 128, H)
		wpj := a.raw(2 * 64 * H)
		fillRandom(c, r, wpj, 2*64*H, "bf16")
		wbf := a.raw(2 * 1024 * H)
		fillRandom(c, r, wbf, 2*1024*H, "bf16")
		const NH = 16384 // a head-like warp-per-row GEMV
		whd := a.raw(2 * NH * H)
		fillRandom(c, r, whd, 2*NH*H, "bf16")
		wf8, sf8 := devFP8(c, a, r, 2048, H)
		wg, sg := devFP8(c, a, r, I, H)
		wu, su := devFP8(c, a, r, I, H)
		wd, sd := devFP8(c, a, r, H, I)
		var eg, es [3][]cuda.DevPtr // gate, up, down of E experts
		for p, nk := range [3][2]int{{I, H}, {I, H}, {H, I}} {
			eg[p], es[p] = devFP8s(c, a, r, E, nk[0], nk[1])
		}
		var tw, ts [3]cuda.DevPtr
		for p := range 3 {
			tw[p], ts[p] = a.up(eg[p]), a.up(es[p])
		}
		ids := make([]int32, top)
		for i := range ids {
			ids[i] = int32(r.IntN(E))
		}
		idp := a.up(ids)
		outs := []struct {
			name string
			p    cuda.DevPtr
			n    int
		}{
			{"q_b 24576x1536", a.raw(4 * 24576), 24576},
			{"o_proj 7168x16384", a.raw(4 * H), H},
			{"o_proj capped grid", a.raw(4 * H), H},
			{"group q_a", a.raw(4 * QL), QL},
			{"group kv_a", a.raw(4 * 576), 576},
			{"group wk", a.raw(4 * 128), 128},
			{"group wproj bf16", a.raw(4 * 64), 64},
			{"gate/up 2048x7168", a.raw(4 * I), I},
			{"experts gate/up 8+1 slots", a.raw(4 * (top + 1) * I), (top + 1) * I},
			{"experts down 8+1 slots", a.raw(4 * (top + 1) * H), (top + 1) * H},
			{"bf16 tile 1024x7168", a.raw(4 * 1024), 1024},
			{"bf16 warp-per-row 16384x7168", a.raw(4 * NH), NH},
			{"fp8 warp-per-row 2048x7168", a.raw(4 * 2048), 2048},
			{"fp8 mma 4 rows o_proj", a.raw(4 * 4 * H), 4 * H},
			{"fp8 mma 4 rows gate/up", a.raw(4 * 4 * I), 4 * I},
			{"bf16 mma 4 rows 16384x7168", a.raw(4 * 4 * NH), 4 * NH},
			{"bf16 wide router 256x7168", a.raw(4 * 256), 256},
			{"fp8 wide 576x7168", a.raw(4 * 576), 576},
		}
		const eps = 1e-6
		run := func() {
			for _, x := range []struct {
				p cuda.DevPtr
				n int
			}{{xq, QL}, {xh, H}, {xh2, H}, {xh3, H}, {xo, O}, {xb, H}, {xh4, 4 * H}, {xo4, 4 * O}} {
				chk(c.MemsetD32(x.p, 0x7fc00000, int64(x.n), s))
			}
			chk(k.RMSNorm(s, xq, inQ, nwQ, 1, QL, QL, QL, eps))
			chk(k.GemvFP8Tile(s, outs[0].p, xq, wqb, sqb, 0, 24576, QL, 1, QL, 24576))
			chk(k.RMSNorm(s, xo, inO, nwO, 1, O, O, O, eps))
			chk(k.GemvFP8Tile(s, outs[1].p, xo, wo, so, 0, H, O, 1, O, H))
			forceTileB = 1
			chk(k.GemvFP8Tile(s, outs[2].p, xo, wo, so, 0, H, O, 1, O, H))
			forceTileB = 0
			chk(k.RMSNorm(s, xh, inH, nwH, 1, H, H, H, eps))
			chk(k.GemvGroup(s, xh, H, 1, H, []GroupSeg{
				{W: wqa, S: sqa, Y: outs[3].p, N: QL, LdY: QL}, {W: wkv, S: skv, Y: outs[4].p, N: 576, LdY: 576},
				{W: wk, S: sk, Y: outs[5].p, N: 128, LdY: 128}, {W: wpj, Y: outs[6].p, N: 64, LdY: 64, BF16: true}}, GroupNorm{}))
			chk(k.RMSNorm(s, xh2, inH, nwH, 1, H, H, H, eps))
			chk(k.GateUpFP8(s, outs[7].p, xh2, wg, sg, wu, su, I, H, 1, H, I))
			chk(k.RMSNorm(s, xh3, inH, nwH, 1, H, H, H, eps))
			chk(k.ExpertsFP8(s, outs[8].p, xh3, H, top, 0, [2]cuda.DevPtr{tw[0], tw[1]}, [2]cuda.DevPtr{ts[0], ts[1]}, idp, top,
				[2]cuda.DevPtr{wg, wu}, [2]cuda.DevPtr{sg, su}, 1, I, H))
			chk(k.ExpertsFP8(s, outs[9].p, outs[8].p, I, 1, top, [2]cuda.DevPtr{tw[2]}, [2]cuda.DevPtr{ts[2]}, idp, top,
				[2]cuda.DevPtr{wd}, [2]cuda.DevPtr{sd}, 1, H, I))
			chk(k.RMSNorm(s, xb, inH, nwH, 1, H, H, H, eps))
			chk(k.GemvBF16Tile(s, outs[10].p, xb, wbf, 0, 1024, H, 1, H, 1024))
			chk(k.RMSNorm(s, xb, inH, nwH, 1, H, H, H, eps))
			chk(k.GemvBF16(s, outs[11].p, xb, whd, 0, NH, H, 1, H, NH))
			chk(k.RMSNorm(s, xh, inH, nwH, 1, H, H, H, eps))
			chk(k.GemvFP8(s, outs[12].p, xh, wf8, sf8, 0, 2048, H, 1, H, 2048))
			chk(k.RMSNorm(s, xo4, inO4, nwO, 4, O, O, O, eps))
			chk(k.GemvFP8MMA(s, outs[13].p, xo4, wo, so, 0, H, O, 4, O, H))
			chk(k.RMSNorm(s, xh4, inH4, nwH, 4, H, H, H, eps))
			chk(k.GateUpFP8MMA(s, outs[14].p, xh4, wg, sg, wu, su, I, H, 4, H, I))
			chk(k.GemvBF16MMA(s, outs[15].p, xh4, whd, 0, NH, H, 4, H, NH))
			chk(k.RMSNorm(s, xb, inH, nwH, 1, H, H, H, eps))
			chk(k.GemvBF16Wide(s, outs[16].p, xb, whd, 0, 256, H, 1, H, 256))
			chk(k.RMSNorm(s, xh, inH, nwH, 1, H, H, H, eps))
			chk(k.GemvFP8Wide(s, outs[17].p, xh, wkv, skv, 0, 576, H, 1, H, 576))
		}
		poison := func() {
			for _, o := range outs {
				chk(c.MemsetD32(o.p, 0x7fc00000, int64(o.n), s))
			}
		}
		got := func() [][]byte {
			chk(c.SyncStream(s))
			b := make([][]byte, len(outs))
			for i, o := range outs {
				b[i] = downBytes(c, o.p, 4*o.n)
			}
			return b
		}
		var ref [][]byte
		for _, mode := range []int{0, 1, 2, 3, 4, 5, 2} {
			chk(k.SetPDLMode(mode))
			for _, graph := range []bool{false, true} {
				poison()
				if graph {
					chk(c.BeginCapture(s))
					run()
					g, err := c.EndCapture(s)
					chk(err)
					chk(c.LaunchGraph(g, s))
					chk(c.LaunchGraph(g, s))
					chk(c.SyncStream(s))
					chk(c.DestroyGraph(g))
				} else {
					run()
				}
				b := got()
				if ref == nil {
					ref = b
					continue
				}
				for i, o := range outs {
					diff := 0
					if !bytes.Equal(b[i], ref[i]) {
						for j := range b[i] {
							if b[i][j] != ref[i][j] {
								diff++
							}
						}
					}
					record(t, fmt.Sprintf("pdl mode %d (graph %v) == plain, bytewise: %s", mode, graph, o.name), "bytes differing", float64(diff), 0)
				}
			}
		}
	})
}
