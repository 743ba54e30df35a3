package kernels

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/tilert-go/tilert/cuda"
)

// moePersistShape is one MoE layer's dimensions for the persistent kernel's
// checks.
type moePersistShape struct {
	name                    string
	E, K, NGroup, TopKGroup int
	H, MI                   int
}

// moePersistPool is the distinct routed experts of a test layer.
const moePersistPool = 4

var moePersistShapes = []moePersistShape{
	{"deepseek-v3.2", 256, 8, 8, 4, 7168, 2048},
	{"tp8-shard", 256, 8, 8, 4, 7168, 256},
	{"glm-like", 256, 8, 1, 1, 6144, 2048},
	{"ds-tiny", 16, 4, 4, 2, 160, 96},
	{"glm-tiny", 16, 4, 1, 1, 288, 80},
	{"odd", 24, 6, 1, 1, 400, 112},
}

// moeLayer is one random MoE layer on the device (expert E is the shared
// one) with the chain's and the persistent kernel's buffers.
type moeLayer struct {
	sh                moePersistShape
	x0, b, pw, nw     []float32
	router            []uint16
	bias              []float32
	ex                [3]fp8Experts
	xp, bp, pwp, nwp  cuda.DevPtr
	rp, biasp         cuda.DevPtr
	tab, tabS         [3]cuda.DevPtr
	shW, shS          [3]cuda.DevPtr
	x, h, rlog, idx   cuda.DevPtr
	wts, eg, ey, mo   cuda.DevPtr
	y, ctl            cuda.DevPtr
	eps, scale        float32
	np                int // distinct routed experts (pool)
	withB, withY, shr bool
	raw               bool // the shard's form: x is the normed row, the combine alone into mo
}

func newMoELayer(c *cuda.Ctx, a *allocs, r *rand.Rand, sh moePersistShape) *moeLayer {
	return newMoELayerOf(c, a, r, sh, false)
}

// newMoELayerOf is newMoELayer; dev: every one of the E experts distinct,
// filled on the device without host copies (timing: real routing reads
// 9 distinct experts' weights; no float64 references).
func newMoELayerOf(c *cuda.Ctx, a *allocs, r *rand.Rand, sh moePersistShape, dev bool) *moeLayer {
	E, H, MI := sh.E, sh.H, sh.MI
	L := &moeLayer{sh: sh, eps: 1e-6, scale: 2.5, withB: true, withY: true, shr: true}
	L.x0, L.b = randF32(r, H, 1), randF32(r, H, 1)
	L.pw, L.nw = randF32(r, H, 1), randF32(r, H, 1)
	L.router = randBF16(r, E*H, 0.05)
	L.bias = randF32(r, E, 0.1)
	// A pool of np distinct routed experts (expert e has pool weights
	// e % np) and the shared one (pool entry np): full-size layers of 256
	// experts would be gigabytes of random weights.
	np := min(E, moePersistPool)
	L.np = np
	dims := [3][2]int{{MI, H}, {MI, H}, {H, MI}}
	if dev {
		L.np = E
		for p := range 3 {
			N, K := dims[p][0], dims[p][1]
			nsc := cdiv(N, 128) * cdiv(K, 128)
			wb, sb := a.raw(int64((E+1)*N*K)), a.raw(int64(4*(E+1)*nsc))
			fillRandom(c, r, wb, int64((E+1)*N*K), "fp8")
			fillRandom(c, r, sb, int64(4*(E+1)*nsc), "f32")
			tw, ts := make([]cuda.DevPtr, E), make([]cuda.DevPtr, E)
			for e := range E {
				tw[e], ts[e] = wb.Add(int64(e*N*K)), sb.Add(int64(4*e*nsc))
			}
			L.tab[p], L.tabS[p] = a.up(tw), a.up(ts)
			L.shW[p], L.shS[p] = wb.Add(int64(E*N*K)), sb.Add(int64(4*E*nsc))
		}
	}
	for p := range 3 {
		if dev {
			break
		}
		L.ex[p] = randFP8Experts(r, a, np+1, dims[p][0], dims[p][1])
		tw, ts := make([]cuda.DevPtr, E), make([]cuda.DevPtr, E)
		for e := range E {
			tw[e], ts[e] = L.ex[p].wp[e%np], L.ex[p].sp[e%np]
		}
		L.tab[p], L.tabS[p] = a.up(tw), a.up(ts)
		L.shW[p], L.shS[p] = L.ex[p].wp[np], L.ex[p].sp[np]
	}
	L.xp, L.bp, L.pwp, L.nwp = a.up(L.x0), a.up(L.b), a.up(L.pw), a.up(L.nw)
	L.rp, L.biasp = a.up(L.router), a.up(L.bias)
	L.x, L.h, L.rlog = a.poisoned(H), a.poisoned(H), a.poisoned(E)
	L.idx, L.wts = a.poisoned(sh.K), a.poisoned(sh.K)
	L.eg, L.ey, L.mo = a.poisoned((sh.K+1)*MI), a.poisoned((sh.K+1)*H), a.poisoned(H)
	L.y = a.poisoned(H)
	L.ctl = a.raw(MoEPersistCtlBytes)
	chk(c.MemsetD32(L.ctl, 0, MoEPersistCtlBytes/4, c.Stream()))
	return L
}

// reset puts the input row back into x (both paths update it in place).
func (L *moeLayer) reset(c *cuda.Ctx, s cuda.Stream) {
	chk(c.CopyDtoD(L.x, L.xp, int64(4*L.sh.H), s))
}

// chain is the default chain of launches at one row.
func (L *moeLayer) chain(k *Set, s cuda.Stream) {
	sh := L.sh
	E, K, H, MI := sh.E, sh.K, sh.H, sh.MI
	hin := L.h
	switch {
	case L.raw:
		hin = L.x
	case L.withB:
		chk(k.AddRMSNorm(s, L.h, L.x, L.bp, L.pwp, 1, H, H, H, H, L.eps))
	default:
		chk(k.RMSNorm(s, L.h, L.x, L.pwp, 1, H, H, H, L.eps))
	}
	chk(k.GemvBF16Wide(s, L.rlog, hin, L.rp, 0, E, H, 1, H, E))
	chk(k.MoERoute(s, L.idx, L.wts, L.rlog, L.biasp, 1, E, K, sh.NGroup, sh.TopKGroup, true, L.scale))
	var gw, gs, dw, ds [2]cuda.DevPtr
	dense := 0
	if L.shr {
		dense = 1
		gw, gs = [2]cuda.DevPtr{L.shW[0], L.shW[1]}, [2]cuda.DevPtr{L.shS[0], L.shS[1]}
		dw, ds = [2]cuda.DevPtr{L.shW[2]}, [2]cuda.DevPtr{L.shS[2]}
	}
	chk(k.ExpertsFP8(s, L.eg, hin, H, K, 0, [2]cuda.DevPtr{L.tab[0], L.tab[1]}, [2]cuda.DevPtr{L.tabS[0], L.tabS[1]}, L.idx, K,
		gw, gs, dense, MI, H))
	chk(k.ExpertsFP8(s, L.ey, L.eg, MI, 1, K, [2]cuda.DevPtr{L.tab[2]}, [2]cuda.DevPtr{L.tabS[2]}, L.idx, K, dw, ds, dense, H, MI))
	resid := cuda.DevPtr(0)
	if L.shr {
		resid = L.ey.Add(int64(4 * K * H))
	}
	if L.raw {
		chk(k.MoECombineSlots(s, L.mo, L.ey, L.wts, resid, 1, K, H))
		return
	}
	if L.withY {
		chk(k.MoECombineSlots(s, L.mo, L.ey, L.wts, resid, 1, K, H))
		chk(k.AddRMSNorm(s, L.y, L.x, L.mo, L.nwp, 1, H, H, H, H, L.eps))
	} else {
		chk(k.MoECombineSlotsRes(s, L.x, L.ey, L.wts, resid, 1, K, H))
	}
}

func (L *moeLayer) args() MoEPersistArgs {
	sh := L.sh
	a := MoEPersistArgs{X: L.x, PostNorm: L.pwp, H: L.h, Eps: L.eps,
		Router: L.rp, RLog: L.rlog, Bias: L.biasp, Idx: L.idx, Wts: L.wts,
		E: sh.E, K: sh.K, NGroup: sh.NGroup, TopKGroup: sh.TopKGroup, NormTopK: true, Scale: L.scale,
		TGate: L.tab[0], TGateS: L.tabS[0], TUp: L.tab[1], TUpS: L.tabS[1], TDown: L.tab[2], TDownS: L.tabS[2],
		EG: L.eg, EY: L.ey, Hidden: sh.H, Inter: sh.MI, Ctl: L.ctl}
	if L.withB {
		a.B = L.bp
	}
	if L.shr {
		a.ShGate, a.ShGateS, a.ShUp, a.ShUpS, a.ShDown, a.ShDownS = L.shW[0], L.shS[0], L.shW[1], L.shS[1], L.shW[2], L.shS[2]
	}
	if L.withY {
		a.Y, a.NextNorm = L.y, L.nwp
	}
	if L.raw {
		a.PostNorm, a.H, a.B, a.Y, a.NextNorm, a.Mo = 0, 0, 0, 0, 0, L.mo
	}
	return a
}

// outs is every output of one MoE half, downloaded.
type moeOuts struct {
	x, h, rlog, wts, eg, ey, y, mo []float32
	idx                            []int32
}

func (L *moeLayer) download(c *cuda.Ctx) moeOuts {
	sh := L.sh
	o := moeOuts{x: downF32(c, L.x, sh.H), h: downF32(c, L.h, sh.H), rlog: downF32(c, L.rlog, sh.E),
		wts: downF32(c, L.wts, sh.K), idx: downI32(c, L.idx, sh.K)}
	ns := sh.K
	if L.shr {
		ns++
	}
	o.eg, o.ey = downF32(c, L.eg, ns*sh.MI), downF32(c, L.ey, ns*sh.H)
	if L.withY {
		o.y = downF32(c, L.y, sh.H)
	}
	if L.raw {
		o.mo = downF32(c, L.mo, sh.H)
	}
	return o
}

// poison refills every output with NaN so a value the kernel does not
// write cannot pass as the chain's.
func (L *moeLayer) poison(c *cuda.Ctx, s cuda.Stream) {
	sh := L.sh
	for _, p := range []struct {
		p cuda.DevPtr
		n int
	}{{L.h, sh.H}, {L.rlog, sh.E}, {L.idx, sh.K}, {L.wts, sh.K}, {L.eg, (sh.K + 1) * sh.MI}, {L.ey, (sh.K + 1) * sh.H}, {L.y, sh.H}, {L.mo, sh.H}} {
		chk(c.MemsetD32(p.p, 0x7fc00000, int64(p.n), s))
	}
}

func moeOutsDiff(a, b moeOuts) (int, string) {
	n, what := 0, ""
	for _, f := range []struct {
		name string
		a, b []float32
	}{{"x", a.x, b.x}, {"h", a.h, b.h}, {"rlog", a.rlog, b.rlog}, {"wts", a.wts, b.wts}, {"eg", a.eg, b.eg}, {"ey", a.ey, b.ey}, {"y", a.y, b.y}, {"mo", a.mo, b.mo}} {
		if d := diffCount(f.a, f.b); d > 0 {
			n += d
			what += fmt.Sprintf(" %s:%d", f.name, d)
		}
	}
	for i := range a.idx {
		if a.idx[i] != b.idx[i] {
			n++
			what += fmt.Sprintf(" idx[%d]", i)
		}
	}
	return n, what
}

// TestKernelMoEPersist checks the persistent MoE kernel against the chain
// of launches it replaces (every output bit for bit: x, h, router logits,
// routing, gate/up, down, next norm) and stage by stage against float64
// references fed the stage's device inputs, on fresh random layers of the
// decode shapes (DeepSeek-V3.2, its TP-8 shard's 256-row experts, GLM-like
// without groups, tiny presets), with and without the attention output to
// add, the shared expert and the next norm; then replays the launch 40
// times directly and 40 times from a CUDA graph (the barrier counters
// carry over between launches) and checks every replay's bits.
func TestKernelMoEPersist(t *testing.T) {
	defer func(v string) { MoEPersistVariant = v }(MoEPersistVariant)
	onGPU(t, func(c *cuda.Ctx, k *Set, a *allocs, r *rand.Rand) {
		s := c.Stream()
		for _, sh := range moePersistShapes {
			L := newMoELayer(c, a, r, sh)
			for _, v := range []string{"", "d16", "b3"} {
				MoEPersistVariant = v
				pl, err := k.MoEPersistPlanFor(sh.E, sh.K, sh.H, sh.MI, true)
				chk(err)
				t.Logf("%s variant %q: plan %+v (blocks an SM: occupancy query, at most the variant's bound %d)", sh.name, v, pl,
					moePersistVariants[v].bps)
			}
			for _, mode := range []struct{ b, y, sh, raw bool }{{true, true, true, false}, {false, true, true, false},
				{true, false, true, false}, {true, true, false, false}, {false, false, true, true}} {
				if !mode.sh && sh.name != "ds-tiny" {
					continue
				}
				L.withB, L.withY, L.shr, L.raw = mode.b, mode.y, mode.sh, mode.raw
				tag := fmt.Sprintf("%s E=%d K=%d H=%d MI=%d b=%v y=%v shared=%v combine-only=%v", sh.name, sh.E, sh.K, sh.H, sh.MI,
					mode.b, mode.y, mode.sh, mode.raw)
				L.poison(c, s)
				L.reset(c, s)
				L.chain(k, s)
				want := L.download(c)
				for _, v := range []string{"", "d16", "b3"} {
					MoEPersistVariant = v
					vtag := tag
					if v != "" {
						vtag += " variant " + v
					}
					L.poison(c, s)
					L.reset(c, s)
					chk(k.MoEPersist(s, L.args()))
					chk(c.SyncStream(s))
					got := L.download(c)
					n, what := moeOutsDiff(got, want)
					if n > 0 {
						t.Logf("%s: differing outputs:%s", vtag, what)
					}
					record(t, "moe_persist vs chain "+vtag, "differing outputs", float64(n), 0)
					// float64 references cost seconds at full dims: the full form at
					// DeepSeek-V3.2's, both forms at the others but GLM-like's.
					if v == "" && ((mode.b && mode.y && mode.sh) || (mode.raw && sh.MI < 2048)) && sh.name != "glm-like" {
						checkMoERef(t, L, got, "moe_persist "+vtag)
					}
					moePersistReplays(t, c, k, L, want, vtag)
				}
			}
		}
	})
}

// moePersistReplays launches the kernel 40 times directly and 40 times
// from a CUDA graph (each after resetting x) and checks every output's
// bits after each batch of 10 against want.
func moePersistReplays(t *testing.T, c *cuda.Ctx, k *Set, L *moeLayer, want moeOuts, tag string) {
	s := c.Stream()
	bad := 0
	for range 40 {
		L.reset(c, s)
		chk(k.MoEPersist(s, L.args()))
	}
	chk(c.SyncStream(s))
	if d, _ := moeOutsDiff(L.download(c), want); d > 0 {
		bad++
	}
	chk(c.BeginCapture(s))
	L.reset(c, s)
	chk(k.MoEPersist(s, L.args()))
	g, err := c.EndCapture(s)
	chk(err)
	for i := range 40 {
		chk(c.LaunchGraph(g, s))
		if i%10 == 9 {
			chk(c.SyncStream(s))
			if d, _ := moeOutsDiff(L.download(c), want); d > 0 {
				bad++
			}
		}
	}
	chk(c.DestroyGraph(g))
	record(t, "moe_persist replays (40 direct, 40 graph) "+tag, "replays with differing outputs", float64(bad), 0)
}

// checkMoERef checks each stage of got against float64 references fed the
// device's inputs to that stage.
func checkMoERef(t *testing.T, L *moeLayer, got moeOuts, name string) {
	sh := L.sh
	E, K, H, MI := sh.E, sh.K, sh.H, sh.MI
	x1 := make([]float32, H) // x + b as float32 (the residual the chain stores)
	for i := range H {
		x1[i] = L.x0[i]
		if L.withB {
			x1[i] += L.b[i]
		}
	}
	hin := got.h
	if L.raw {
		hin = L.x0
	} else {
		record(t, name+" h", relMetric, relErr(got.h, refRMSNorm(x1, L.pw, 1, H, float64(L.eps))), boundF32)
	}
	record(t, name+" router", relMetric, relErr(got.rlog, refGemv(func(n, k int) float64 { return bf16ToF64(L.router[n*H+k]) }, hin, nil, E, H, 1, H, E)), boundF32)
	ids, wts, _ := refMoERoute(got.rlog, L.bias, E, K, sh.NGroup, sh.TopKGroup, true, float64(L.scale))
	bad := 0
	for j := range K {
		if int(got.idx[j]) != ids[j] {
			bad++
		}
	}
	record(t, name+" routing", "differing ids", float64(bad), 0)
	wref := make([]float64, K)
	copy(wref, wts)
	record(t, name+" weights", relMetric, relErr(got.wts, wref), boundF32)
	ns := K
	if L.shr {
		ns++
	}
	egRef := make([]float64, ns*MI)
	eyRef := make([]float64, ns*H)
	for j := range ns {
		e := L.np
		if j < K {
			e = int(got.idx[j]) % L.np
		}
		g := refGemv(L.ex[0].at(e), hin, nil, MI, H, 1, H, MI)
		u := refGemv(L.ex[1].at(e), hin, nil, MI, H, 1, H, MI)
		copy(egRef[j*MI:], refSiluMul(g, u))
		copy(eyRef[j*H:], refGemv(L.ex[2].at(e), got.eg[j*MI:], nil, H, MI, 1, MI, H))
	}
	record(t, name+" gate/up", relMetric, relErr(got.eg, egRef), boundF32)
	record(t, name+" down", relMetric, relErr(got.ey, eyRef), boundF32)
	xRef := make([]float64, H)
	x2 := make([]float32, H)
	base := x1
	if L.raw {
		base = make([]float32, H) // the combine alone
	}
	for i := range H {
		v := float64(base[i])
		if L.shr {
			v += float64(got.ey[K*H+i])
		}
		for j := range K {
			v += float64(got.wts[j]) * float64(got.ey[j*H+i])
		}
		xRef[i] = v
		x2[i] = got.x[i]
	}
	if L.raw {
		record(t, name+" combine", relMetric, relErr(got.mo, xRef), boundF32)
		return
	}
	record(t, name+" residual", relMetric, relErr(got.x, xRef), boundF32)
	if L.withY {
		record(t, name+" next norm", relMetric, relErr(got.y, refRMSNorm(x2, L.nw, 1, H, float64(L.eps))), boundF32)
	}
}

// TestMoEPersistPlan pins the host-side plan on the decode shapes (132
// SMs): the chain's group sizes (so the same sums), the router's rows per
// block, the norm's threads and a grid of two blocks an SM that covers the
// norm's virtual warps.
func TestMoEPersistPlan(t *testing.T) {
	for _, tc := range []struct {
		E, K, H, MI int
		want        MoEPersistPlan
	}{
		{256, 8, 7168, 2048, MoEPersistPlan{Ggu: 64, Gd: 64, RR: 1, NT: 1024, Grid: 264}},
		{256, 8, 7168, 256, MoEPersistPlan{Ggu: 64, Gd: 32, RR: 1, NT: 1024, Grid: 264}},
		{256, 8, 6144, 2048, MoEPersistPlan{Ggu: 64, Gd: 64, RR: 1, NT: 1024, Grid: 264}},
	} {
		got := moePersistPlan(132, tc.E, tc.K, tc.H, tc.MI, true)
		if got != tc.want {
			t.Errorf("plan E=%d K=%d H=%d MI=%d: %+v, want %+v", tc.E, tc.K, tc.H, tc.MI, got, tc.want)
		}
		// the chain's own choices, recomputed the way its launchers do
		G, _ := tileShape(132, tc.MI, tc.H, 1, tc.K+1, true)
		Gd, _ := tileShape(132, tc.H, tc.MI, 1, tc.K+1, false)
		if got.Ggu != G || got.Gd != Gd || got.RR != gemvWideRowsFor(132, tc.E, 2*tc.H, 1) {
			t.Errorf("plan %+v is not the chain's shape", got)
		}
		if got.Grid < got.NT/32 {
			t.Errorf("grid %d below the norm's %d blocks", got.Grid, got.NT/32)
		}
	}
	for _, tc := range []struct {
		regs, bps int
		ok        bool
	}{{128, 2, true}, {129, 2, false}, {80, 3, true}, {85, 3, false}, {255, 1, true}, {0, 2, false}} {
		if err := moePersistFits(tc.regs, tc.bps, 232448); (err == nil) != tc.ok {
			t.Errorf("%d registers, %d blocks an SM: %v (want ok %v)", tc.regs, tc.bps, err, tc.ok)
		}
	}
	if err := moePersistFits(64, 6, 232448); err == nil {
		t.Errorf("6 blocks of 41 KB shared memory accepted")
	}
	for v, pv := range moePersistVariants {
		if !strings.Contains(PersistKernelSource(), "void __launch_bounds__(MP_THREADS, "+fmt.Sprint(pv.bps)+")\n    "+pv.name+"(") {
			t.Errorf("variant %q: %s with __launch_bounds__(MP_THREADS, %d) not in the source", v, pv.name, pv.bps)
		}
	}
	for _, sh := range moePersistShapes {
		if err := MoEPersistShapeOK(sh.E, sh.K, sh.H, sh.MI); err != nil {
			t.Errorf("%s: %v", sh.name, err)
		}
	}
	for _, bad := range [][4]int{{300, 8, 7168, 2048}, {256, 8, 9216, 2048}, {256, 8, 7160, 2048}, {256, 0, 7168, 2048}, {256, 8, 7168, 100}, {256, 17, 7168, 2048}} {
		if MoEPersistShapeOK(bad[0], bad[1], bad[2], bad[3]) == nil {
			t.Errorf("shape %v accepted", bad)
		}
	}
}

// TestKernelMoEPersistTiming times the persistent kernel beside the chain of
// launches it replaces on the same inputs and a device-to-device copy,
// graph-timed, DeepSeek-V3.2 dims and the TP-8 shard's, expert weights
// cold (the layer is rotated over copies past the L2). Reported, never
// asserted.
func TestKernelMoEPersistTiming(t *testing.T) {
	needTiming(t)
	defer func(v string) { MoEPersistVariant = v }(MoEPersistVariant)
	onGPU(t, func(c *cuda.Ctx, k *Set, a *allocs, r *rand.Rand) {
		s := c.Stream()
		add := timingTable(t, c, a, r, 256<<20, "moe persist: device-to-device copy 256 MiB (read+write)", "reference")
		for _, sh := range moePersistShapes[:2] {
			E, K, H, MI := sh.E, sh.K, sh.H, sh.MI
			// Bytes one row's MoE half must read: the router, the 8 routed
			// experts' and the shared expert's gate/up/down (+ scales).
			bytes := float64(2*E*H + (K+1)*3*MI*H + (K+1)*3*4*cdiv(MI, 128)*cdiv(H, 128))
			// All 256 experts distinct (device-filled), layers rotated so
			// the 9 slots' weights come from HBM: 396 MB a run at
			// DeepSeek-V3.2 dims, 50 MB in the shard (4 layers: 200 MB).
			nc := 1
			if MI < 1024 {
				nc = 4
			}
			layers := make([]*moeLayer, nc)
			for i := range layers {
				layers[i] = newMoELayerOf(c, a, r, sh, true)
			}
			for _, raw := range []bool{false, true} {
				if raw && MI >= 1024 {
					continue
				}
				form := "norm, router, route, 2 expert launches, combine, norm"
				if raw {
					form = "shard form: router, route, 2 expert launches, combine"
				}
				for _, L := range layers {
					L.raw = raw
				}
				chainUs := graphUsRot(c, s, 2*nc, 21, func(j int) { L := layers[j%nc]; L.reset(c, s); L.chain(k, s) })
				add(fmtName("%s chain (%s) + x reset", sh.name, form), bytes, chainUs, "")
				for _, v := range []string{"", "d16", "b3"} {
					MoEPersistVariant = v
					persUs := graphUsRot(c, s, 2*nc, 21, func(j int) { L := layers[j%nc]; L.reset(c, s); chk(k.MoEPersist(s, L.args())) })
					add(fmtName("%s %s (%s) + x reset", sh.name, moePersistVariants[v].name, form), bytes, persUs,
						fmtName("%.2fx the chain", chainUs/persUs))
				}
				MoEPersistVariant = ""
			}
			resetUs := graphUsRot(c, s, 2*nc, 21, func(j int) { layers[j%nc].reset(c, s) })
			add(fmtName("%s x reset alone", sh.name), float64(8*H), resetUs, "subtract from both rows")
		}
	})
}

// TestNVRTCCompilesPersist compiles the persistent module with NVRTC (no
// GPU needed) and checks that the default module's source does not hold
// it (that module's cache entry stays warm).
func TestNVRTCCompilesPersist(t *testing.T) {
	if strings.Contains(KernelSource(), "moe_persist_m1") {
		t.Fatal("the persistent kernel is in the default module")
	}
	nv, err := cuda.LoadNVRTC()
	if err != nil {
		t.Skipf("no NVRTC here, compile check skipped: %v", err)
	}
	ck, err := CompilePersist(nv, 9, 0, cuda.KernelCache{Dir: t.TempDir()})
	if err != nil {
		t.Fatalf("%+v", err)
	}
	t.Logf("persistent module for %s in %v, %d bytes", ck.Arch, ck.Took, len(ck.Image))
}

// TestMoEPersistLaunchArgs checks the launcher's argument list against
// every variant's signature in the source: the count, and a float32 where
// the kernel takes a float, a Go int where it takes an int, a device
// pointer where it takes a pointer (the binding packs each by its Go type).
func TestMoEPersistLaunchArgs(t *testing.T) {
	src := PersistKernelSource()
	args := moePersistLaunchArgs(MoEPersistArgs{Ctl: 1 << 20}, MoEPersistPlan{})
	for _, v := range moePersistVariants {
		i := strings.Index(src, v.name+"(")
		if i < 0 {
			t.Fatalf("%s not in the source", v.name)
		}
		j := strings.Index(src[i:], ")")
		params := strings.Split(src[i+len(v.name)+1:i+j], ",")
		if len(params) != len(args) {
			t.Fatalf("%s takes %d parameters, the launcher passes %d", v.name, len(params), len(args))
		}
		for n, p := range params {
			p = strings.TrimSpace(p)
			var want string
			switch {
			case strings.Contains(p, "*"):
				want = "cuda.DevPtr"
			case strings.HasPrefix(p, "float "):
				want = "float32"
			case strings.HasPrefix(p, "int "):
				want = "int"
			default:
				t.Fatalf("%s parameter %d %q: unknown type", v.name, n, p)
			}
			if got := fmt.Sprintf("%T", args[n]); got != want {
				t.Errorf("%s parameter %d %q: the launcher passes a %s", v.name, n, p, got)
			}
		}
	}
	if len(args) > 64 {
		t.Errorf("%d arguments: past the binding's bound", len(args))
	}
}
