package kernels

import (
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/tilert-go/tilert/cuda"
)

// TestKernelGemvTile checks the tile GEMVs (dense fp8 for 1..8 rows, bf16
// for 5..8, gate/up/SwiGLU paired, routed experts plus the shared expert
// in one launch, the per-row combine) against the float64 reference on
// fresh random inputs, for the launcher's choice and for pinned group
// sizes and rows per group, and that two runs agree bit for bit.
func TestKernelGemvTile(t *testing.T) {
	defer func(r int) { TileRule = r }(TileRule)
	type cfg struct {
		rule, G, R int
		v          string
		B          int
	}
	cfgs := []cfg{{1, 0, 0, "", 0}, {2, 0, 0, "", 0}, {3, 0, 0, "", 0}, {1, 32, 2, "-", 0}, {1, 128, 1, "-", 0},
		{2, 256, 8, "-", 0}, {2, 64, 4, "-", 0}, {2, 256, 2, "-", 0}, {3, 64, 8, "_d16", 0}, {3, 32, 4, "_d16", -2},
		{3, 128, 2, "_d16", 0}, {3, 64, 8, "_o4", 2}, {3, 256, 4, "_o4", -3}, {3, 0, 0, "", 1}}
	for _, cf := range cfgs {
		tag := fmt.Sprintf(" rule=%d G=%d R=%d%s B=%d", cf.rule, cf.G, cf.R, cf.v, cf.B)
		t.Run(strings.ReplaceAll(tag[1:], " ", "_"), func(t *testing.T) {
			TileRule = cf.rule
			forceTileG, forceTileR, forceTileV, forceTileB = cf.G, cf.R, cf.v, cf.B
			defer func() { forceTileG, forceTileR, forceTileV, forceTileB = 0, 0, "", 0 }()
			testGemvTile(t, tag)
		})
	}
}

// TestKernelTileVariantsBitwise: every variant of one input row runs the
// plain kernel's per-thread chunk order, so for the same group size and
// rows per group it must give the same floats, bit for bit (fresh random
// experts, routed and shared, gate-up paired and down, and a dense GEMV).
func TestKernelTileVariantsBitwise(t *testing.T) {
	defer func(r int) { TileRule = r }(TileRule)
	defer func() { forceTileG, forceTileR, forceTileV, forceTileB = 0, 0, "", 0 }()
	TileRule = 2
	onGPU(t, func(c *cuda.Ctx, k *Set, a *allocs, r *rand.Rand) {
		s := c.Stream()
		const E, top, H, I = 12, 8, 1024, 384
		var tabW, tabS, shW, shS [3]cuda.DevPtr
		dims := [3][2]int{{I, H}, {I, H}, {H, I}}
		for p := range 3 {
			ex := randFP8Experts(r, a, E+1, dims[p][0], dims[p][1])
			tabW[p], tabS[p] = a.up(ex.wp[:E]), a.up(ex.sp[:E])
			shW[p], shS[p] = ex.wp[E], ex.sp[E]
		}
		ids := make([]int32, top)
		for j, e := range r.Perm(E)[:top] {
			ids[j] = int32(e)
		}
		idp := a.up(ids)
		h := a.up(randF32(r, H, 1))
		gu := a.poisoned((top + 1) * I)
		dw := randFP8(r, 1000*1536)
		dwp, dsp := a.up(dw), a.up(randScales(r, cdiv(1000, 128)*cdiv(1536, 128), -8))
		dx := a.up(randF32(r, 1536, 1))
		run := func() [3][]float32 {
			var out [3][]float32
			chk(k.ExpertsFP8(s, gu, h, H, top, 0, [2]cuda.DevPtr{tabW[0], tabW[1]}, [2]cuda.DevPtr{tabS[0], tabS[1]}, idp, top,
				[2]cuda.DevPtr{shW[0], shW[1]}, [2]cuda.DevPtr{shS[0], shS[1]}, 1, I, H))
			out[0] = downF32(c, gu, (top+1)*I)
			yd := a.poisoned((top + 1) * H)
			chk(k.ExpertsFP8(s, yd, gu, I, 1, top, [2]cuda.DevPtr{tabW[2]}, [2]cuda.DevPtr{tabS[2]}, idp, top,
				[2]cuda.DevPtr{shW[2]}, [2]cuda.DevPtr{shS[2]}, 1, H, I))
			out[1] = downF32(c, yd, (top+1)*H)
			yq := a.poisoned(1000)
			chk(k.GemvFP8Tile(s, yq, dx, dwp, dsp, 0, 1000, 1536, 1, 1536, 1000))
			out[2] = downF32(c, yq, 1000)
			return out
		}
		for _, g := range []int{32, 64, 128, 256} {
			for _, rr := range []int{2, 4, 8} {
				forceTileG, forceTileR, forceTileV = g, rr, "-"
				plain := run()
				for _, v := range tileVariants {
					for _, b := range []int{0, -3, 2} { // a block per tile, 3 blocks per slot, 2 per SM
						if (v == "_o4" && rr < 4) || (v == "" && b == 0) {
							continue
						}
						forceTileV, forceTileB = v, b
						if v == "" {
							forceTileV = "-"
						}
						got := run()
						for i, what := range []string{"experts gate-up", "experts down", "gemv 1000x1536"} {
							record(t, fmt.Sprintf("tile variant %q B=%d G=%d R=%d == plain: %s", v, b, g, rr, what), "differing outputs",
								float64(diffCount(got[i], plain[i])), 0)
						}
					}
				}
				forceTileB = 0
			}
		}
	})
}

func refSiluMul(g, u []float64) []float64 {
	out := make([]float64, len(g))
	for i := range g {
		out[i] = g[i] / (1 + math.Exp(-g[i])) * u[i]
	}
	return out
}

func testGemvTile(t *testing.T, tag string) {
	onGPU(t, func(c *cuda.Ctx, k *Set, a *allocs, r *rand.Rand) {
		s := c.Stream()
		for _, cs := range []gemvCase{
			{576, 7168, 1, 0, false}, {200, 7168, 4, 0, true}, {64, 7168, 8, 4, false}, {129, 16384, 2, 0, true},
			{300, 1536, 3, 0, false}, {260, 2048, 5, 0, true}, {130, 256, 8, 0, false}, {9, 16, 7, 0, true},
			{50, 100, 6, 0, true},     // K % 16 != 0: falls back to gemv_fp8 in chunks of 4 rows
			{8192, 1536, 1, 0, false}, // one row of 1536 bytes: groups of 32 by default (OneRowWholeChunks)
		} {
			checkGemvFP8(t, c, a, r, k.GemvFP8Tile, cs, "gemv_tile_fp8 "+cs.dims()+tag, true)
		}
		// bf16: 5..8 rows (K % 8 != 0 falls back to gemv_bf16 in chunks of 4).
		for _, cs := range []gemvCase{{256, 7168, 5, 0, false}, {64, 7168, 8, 8, true}, {129, 200, 6, 0, true}, {50, 37, 7, 0, false}} {
			checkGemvBF16(t, c, a, r, k.GemvBF16Tile, cs, "gemv_tile_bf16 "+cs.dims()+tag)
		}
		// Fewer rows have no bf16 tile kernel: refused, nothing launched.
		bx, bw, by := a.up(randF32(r, 8*7168, 1)), a.up(randBF16(r, 256*7168, 0.05)), a.poisoned(8*256)
		for M := 1; M < GemvBF16TileMinM; M++ {
			if err := k.GemvBF16Tile(s, by, bx, bw, 0, 256, 7168, M, 7168, 256); err == nil {
				t.Errorf("GemvBF16Tile accepted M=%d", M)
			}
		}
		// gate, up and SwiGLU in one launch.
		for _, cs := range []gemvCase{{300, 2048, 3, 0, false}, {2048, 7168, 1, 0, false}, {130, 1536, 8, 4, false}} {
			N, K, M := cs.N, cs.K, cs.M
			ldx := K + cs.pad
			wg, wu := randFP8(r, N*K), randFP8(r, N*K)
			sg, su := randScales(r, cdiv(N, 128)*cdiv(K, 128), -8), randScales(r, cdiv(N, 128)*cdiv(K, 128), -8)
			x := randF32(r, M*ldx, 1)
			yp := a.poisoned(M * N)
			chk(k.GateUpFP8(s, yp, a.up(x), a.up(wg), a.up(sg), a.up(wu), a.up(su), N, K, M, ldx, N))
			ref := refSiluMul(refGemv(fp8At(wg, sg, K), x, nil, N, K, M, ldx, N), refGemv(fp8At(wu, su, K), x, nil, N, K, M, ldx, N))
			record(t, fmt.Sprintf("gate_up_fp8 N=%d K=%d M=%d ldx=%d", N, K, M, ldx)+tag, relMetric, relErr(downF32(c, yp, M*N), ref), boundF32)
		}
		// A MoE layer for M rows: gate/up (+SwiGLU) of every routed slot and
		// the shared expert in one launch, down likewise, then the combine.
		for _, ec := range []struct{ E, top, M, H, I int }{{6, 4, 3, 384, 256}, {16, 8, 1, 7168, 256}, {9, 2, 2, 2048, 144}} {
			E, top, M, H, I := ec.E, ec.top, ec.M, ec.H, ec.I
			slots := M * top
			var ex [3]fp8Experts
			var tabW, tabS, sharedW, sharedS [3]cuda.DevPtr
			dims := [3][2]int{{I, H}, {I, H}, {H, I}}
			for p := range 3 {
				ex[p] = randFP8Experts(r, a, E+1, dims[p][0], dims[p][1]) // expert E is the shared one
				tabW[p], tabS[p] = a.up(ex[p].wp[:E]), a.up(ex[p].sp[:E])
				sharedW[p], sharedS[p] = ex[p].wp[E], ex[p].sp[E]
			}
			ids := make([]int32, slots)
			for j := range ids {
				ids[j] = int32(r.IntN(E))
			}
			ids[slots-1] = ids[0] // a repeated expert
			wsum := randF32(r, slots, 0.3)
			h := randF32(r, M*H, 1)
			hp, idp := a.up(h), a.up(ids)
			gu := a.poisoned((slots + M) * I)
			chk(k.ExpertsFP8(s, gu, hp, H, top, 0, [2]cuda.DevPtr{tabW[0], tabW[1]}, [2]cuda.DevPtr{tabS[0], tabS[1]}, idp, slots,
				[2]cuda.DevPtr{sharedW[0], sharedW[1]}, [2]cuda.DevPtr{sharedS[0], sharedS[1]}, M, I, H))
			guGot := downF32(c, gu, (slots+M)*I)
			guRef := make([]float64, (slots+M)*I)
			for j := range slots + M {
				e, xr := E, j-slots
				if j < slots {
					e, xr = int(ids[j]), j/top
				}
				g := refGemv(ex[0].at(e), h[xr*H:], nil, I, H, 1, H, I)
				u := refGemv(ex[1].at(e), h[xr*H:], nil, I, H, 1, H, I)
				copy(guRef[j*I:], refSiluMul(g, u))
			}
			name := fmt.Sprintf("experts_gate_up E=%d top=%d M=%d H=%d I=%d", E, top, M, H, I) + tag
			record(t, name, relMetric, relErr(guGot, guRef), boundF32)
			// down reads the gate-up output just computed (as float32).
			yd := a.poisoned((slots + M) * H)
			chk(k.ExpertsFP8(s, yd, gu, I, 1, slots, [2]cuda.DevPtr{tabW[2]}, [2]cuda.DevPtr{tabS[2]}, idp, slots,
				[2]cuda.DevPtr{sharedW[2]}, [2]cuda.DevPtr{sharedS[2]}, M, H, I))
			ydGot := downF32(c, yd, (slots+M)*H)
			ydRef := make([]float64, (slots+M)*H)
			for j := range slots + M {
				e := E
				if j < slots {
					e = int(ids[j])
				}
				copy(ydRef[j*H:], refGemv(ex[2].at(e), guGot[j*I:], nil, H, I, 1, I, H))
			}
			record(t, fmt.Sprintf("experts_down E=%d top=%d M=%d H=%d I=%d", E, top, M, H, I)+tag, relMetric, relErr(ydGot, ydRef), boundF32)
			// The routed slots and the shared expert as two launches shaped
			// as the one above (the engine's side stream, side.go): the same
			// bits, slot by slot.
			gu2, yd2 := a.poisoned((slots+M)*I), a.poisoned((slots+M)*H)
			chk(k.ExpertsFP8Shaped(s, gu2.Add(int64(4*slots*I)), hp, H, top, 0, [2]cuda.DevPtr{}, [2]cuda.DevPtr{}, 0, 0,
				[2]cuda.DevPtr{sharedW[0], sharedW[1]}, [2]cuda.DevPtr{sharedS[0], sharedS[1]}, M, I, H, slots+M))
			chk(k.ExpertsFP8Shaped(s, gu2, hp, H, top, 0, [2]cuda.DevPtr{tabW[0], tabW[1]}, [2]cuda.DevPtr{tabS[0], tabS[1]}, idp, slots,
				[2]cuda.DevPtr{}, [2]cuda.DevPtr{}, 0, I, H, slots+M))
			chk(k.ExpertsFP8Shaped(s, yd2.Add(int64(4*slots*H)), gu, I, 1, slots, [2]cuda.DevPtr{}, [2]cuda.DevPtr{}, 0, 0,
				[2]cuda.DevPtr{sharedW[2]}, [2]cuda.DevPtr{sharedS[2]}, M, H, I, slots+M))
			chk(k.ExpertsFP8Shaped(s, yd2, gu, I, 1, slots, [2]cuda.DevPtr{tabW[2]}, [2]cuda.DevPtr{tabS[2]}, idp, slots,
				[2]cuda.DevPtr{}, [2]cuda.DevPtr{}, 0, H, I, slots+M))
			record(t, fmt.Sprintf("experts split routed | shared, shaped as one E=%d top=%d M=%d", E, top, M)+tag, "differing outputs",
				float64(diffCount(downF32(c, gu2, (slots+M)*I), guGot)+diffCount(downF32(c, yd2, (slots+M)*H), ydGot)), 0)
			// The routed launches on pinned plans (SetTilePlan with
			// PlanPair / PlanExperts, TILERT_GPU_TILE_PLANS' p / e): with
			// the shape's own G the same bits, else another summation order.
			if M == 1 {
				sms := c.Info().SMs
				// the unpinned reference: one launch of routed and shared slots
				gG, _, _ := tileLaunchShape(sms, I, H, 1, 1, slots+M, true, false, expertLaunch{})
				dG, _, _ := tileLaunchShape(sms, H, I, 1, 1, slots+M, false, false, expertLaunch{})
				for _, ps := range []string{"G64/R8_d16/B0", "G64/R4_o4/B0", "G32/R8_o4/B2", "G64/R2_d16/B1", "G128/R8/B0", "G32/R4/B0"} {
					p := mustPlan(ps)
					prevG := k.SetTilePlan(I|PlanPair, H, p)
					prevD := k.SetTilePlan(H|PlanExperts, I, p)
					gu3, yd3 := a.poisoned(slots*I), a.poisoned(slots*H)
					chk(k.ExpertsFP8Shaped(s, gu3, hp, H, top, 0, [2]cuda.DevPtr{tabW[0], tabW[1]}, [2]cuda.DevPtr{tabS[0], tabS[1]}, idp, slots,
						[2]cuda.DevPtr{}, [2]cuda.DevPtr{}, 0, I, H, slots+M))
					chk(k.ExpertsFP8Shaped(s, yd3, gu, I, 1, slots, [2]cuda.DevPtr{tabW[2]}, [2]cuda.DevPtr{tabS[2]}, idp, slots,
						[2]cuda.DevPtr{}, [2]cuda.DevPtr{}, 0, H, I, slots+M))
					k.SetTilePlan(I|PlanPair, H, prevG)
					k.SetTilePlan(H|PlanExperts, I, prevD)
					g3, d3 := downF32(c, gu3, slots*I), downF32(c, yd3, slots*H)
					name := fmt.Sprintf("experts E=%d top=%d H=%d I=%d pinned %s", E, top, H, I, ps) + tag
					if p.G == gG {
						record(t, name+" gate/up == unpinned", "differing outputs", float64(diffCount(g3, guGot[:slots*I])), 0)
					} else {
						record(t, name+" gate/up (another sum order)", relMetric, relErr(g3, guRef[:slots*I]), boundF32)
					}
					// down on the unpinned gate/up output: its reference
					if p.G == dG {
						record(t, name+" down == unpinned", "differing outputs", float64(diffCount(d3, ydGot[:slots*H])), 0)
					} else {
						record(t, name+" down (another sum order)", relMetric, relErr(d3, ydRef[:slots*H]), boundF32)
					}
				}
			}
			out := a.poisoned(M * H)
			chk(k.MoECombineSlots(s, out, yd, a.up(wsum), yd.Add(int64(4*slots*H)), M, top, H))
			cRef := make([]float64, M*H)
			for m := range M {
				for n := range H {
					v := float64(ydGot[(slots+m)*H+n])
					for jj := range top {
						v += float64(wsum[m*top+jj]) * float64(ydGot[(m*top+jj)*H+n])
					}
					cRef[m*H+n] = v
				}
			}
			record(t, fmt.Sprintf("moe_combine_slots M=%d k=%d N=%d", M, top, H)+tag, relMetric, relErr(downF32(c, out, M*H), cRef), boundF32)
		}
	})
}

// TestTileShape pins the launcher's choice on the decode shapes (132 SMs)
// under both rules. Rule 2, from the H200 sweep: 64 threads x 8 rows where
// the grid is big enough, wider groups then fewer rows for small N, fewer
// rows for many input rows.
func TestTileShape(t *testing.T) {
	defer func(r int) { TileRule = r }(TileRule)
	type shapeCase struct {
		N, K, M, slots int
		pair           bool
		G, R           int
	}
	TileRule = 1
	for _, cs := range []shapeCase{
		{7168, 16384, 1, 1, false, 256, 2}, {2048, 7168, 1, 1, false, 128, 2}, {7168, 2048, 1, 1, false, 64, 4},
		{24576, 1536, 1, 1, false, 32, 2}, {576, 7168, 1, 1, false, 128, 1}, {7168, 2048, 8, 1, false, 64, 2},
		{2048, 7168, 1, 9, true, 128, 2},
	} {
		if G, R := tileShape(132, cs.N, cs.K, cs.M, cs.slots, cs.pair); G != cs.G || R != cs.R {
			t.Errorf("rule 1: N=%d K=%d M=%d slots=%d pair=%v: G=%d R=%d, want G=%d R=%d", cs.N, cs.K, cs.M, cs.slots, cs.pair, G, R, cs.G, cs.R)
		}
	}
	TileRule = 2
	cases := []shapeCase{
		{7168, 16384, 1, 1, false, 64, 8}, {2048, 7168, 1, 1, false, 256, 8}, {7168, 2048, 1, 1, false, 64, 8},
		{24576, 1536, 1, 1, false, 64, 8}, {1536, 7168, 1, 1, false, 256, 8}, {576, 7168, 1, 1, false, 256, 8},
		{128, 7168, 1, 1, false, 256, 1}, {256, 7168, 1, 1, false, 256, 2}, {7168, 256, 1, 9, false, 32, 8},
		{7168, 16384, 4, 1, false, 64, 8}, {7168, 16384, 8, 1, false, 64, 4}, {2048, 7168, 1, 9, true, 64, 8},
		{256, 7168, 1, 9, true, 64, 8},
	}
	// Rule 3 keeps rule 2's group sizes and rows per group (the same floats).
	for _, rule := range []int{2, 3} {
		TileRule = rule
		for _, cs := range cases {
			G, R := tileShape(132, cs.N, cs.K, cs.M, cs.slots, cs.pair)
			if G != cs.G || R != cs.R {
				t.Errorf("rule %d: N=%d K=%d M=%d slots=%d pair=%v: G=%d R=%d, want G=%d R=%d", rule, cs.N, cs.K, cs.M, cs.slots, cs.pair, G, R, cs.G, cs.R)
			}
			if R*tileMM(cs.M) > 32 || (cs.pair && R < 2) {
				t.Errorf("R=%d for M=%d pair=%v is not a compiled variant", R, cs.M, cs.pair)
			}
		}
	}
}

// TestTileVariant pins rule 3's variant on the decode shapes (132 SMs):
// four blocks per SM for the experts' down projections, 16 loads in flight
// elsewhere, the plain kernels for one row per group and several input rows.
func TestTileVariant(t *testing.T) {
	defer func(r int) { TileRule = r }(TileRule)
	TileRule = 3
	for _, cs := range []struct {
		N, K, M, slots int
		pair           bool
		want           string
	}{
		{7168, 16384, 1, 1, false, "_d16"}, {24576, 1536, 1, 1, false, "_d16"}, {8192, 1536, 1, 1, false, "_d16"},
		{2048, 7168, 1, 9, true, "_d16"}, {7168, 2048, 1, 9, false, "_o4"}, {7168, 2048, 1, 36, false, "_o4"},
		{7168, 256, 1, 9, false, "_o4"}, {256, 7168, 1, 9, true, "_d16"}, {128, 7168, 1, 1, false, ""},
		{7168, 16384, 4, 1, false, ""},
	} {
		G, R := tileShape(132, cs.N, cs.K, cs.M, cs.slots, cs.pair)
		if got := tileVariant(G, R, cs.K, cs.M, 1); got != cs.want {
			t.Errorf("N=%d K=%d M=%d slots=%d (G=%d R=%d): variant %q, want %q", cs.N, cs.K, cs.M, cs.slots, G, R, got, cs.want)
		}
	}
	for _, rule := range []int{1, 2} {
		TileRule = rule
		if got := tileVariant(64, 8, 2048, 1, 1); got != "" {
			t.Errorf("rule %d: variant %q, want the plain kernel", rule, got)
		}
	}
}

// mustPlan is ParseTilePlan for a plan the test writes itself.
func mustPlan(s string) TilePlan {
	p, err := ParseTilePlan(s)
	chk(err)
	return p
}

// TestTileLaunchShape: a single row's routed-expert launches (at most 9
// slots shaped together, no shared slot) take OneRowExperts' shapes: the
// gate/up on _o4 on an H200 (ExpertPair), the down on groups of 32 where
// its last wave is fuller (DeepSeek-V3.2's 7168 rows, not GLM-5's 6144) or
// ExpertDownG32 says so; several rows' launches, the shared expert's, dense
// GEMVs and OneRowExperts off keep the rule's.
func TestTileLaunchShape(t *testing.T) {
	defer func(r int, on, d32 bool, p string) {
		TileRule, OneRowExperts, ExpertDownG32, ExpertPair = r, on, d32, p
	}(TileRule, OneRowExperts, ExpertDownG32, ExpertPair)
	TileRule = 3
	type shape struct {
		G, R int
		v    string
	}
	const h200, h100 = "NVIDIA H200", "NVIDIA H100 80GB HBM3"
	for _, cs := range []struct {
		card             string
		N, K, M, shapeAs int
		slots            int
		pair, routed     bool
		on, s30, off     shape
	}{
		{h200, 2048, 7168, 1, 9, 8, true, true, shape{64, 8, "_o4"}, shape{64, 8, "_o4"}, shape{64, 8, "_d16"}},  // DeepSeek-V3.2 gate/up, one row
		{h100, 2048, 7168, 1, 9, 8, true, true, shape{64, 8, "_d16"}, shape{64, 8, "_o4"}, shape{64, 8, "_d16"}}, // on an H100
		{h200, 7168, 2048, 1, 9, 8, false, true, shape{32, 8, "_o4"}, shape{32, 8, "_o4"}, shape{64, 8, "_o4"}},  // its down: 70% of a last wave against 39%
		{h100, 7168, 2048, 1, 9, 8, false, true, shape{32, 8, "_o4"}, shape{32, 8, "_o4"}, shape{64, 8, "_o4"}},
		{h200, 2048, 6144, 1, 9, 8, true, true, shape{64, 8, "_o4"}, shape{64, 8, "_o4"}, shape{64, 8, "_d16"}}, // GLM-5
		{h100, 2048, 6144, 1, 9, 8, true, true, shape{64, 8, "_d16"}, shape{64, 8, "_o4"}, shape{64, 8, "_d16"}},
		{h200, 6144, 2048, 1, 9, 8, false, true, shape{64, 8, "_o4"}, shape{32, 8, "_o4"}, shape{64, 8, "_o4"}},      // its down: 45% against 91%
		{h200, 6144, 2048, 1, 9, 9, false, true, shape{32, 8, "_o4"}, shape{32, 8, "_o4"}, shape{64, 8, "_o4"}},      // 9 slots run: 64% against 27%
		{h200, 7168, 2048, 1, 18, 16, false, true, shape{64, 8, "_o4"}, shape{64, 8, "_o4"}, shape{64, 8, "_o4"}},    // two rows: unchanged
		{h200, 2048, 7168, 1, 36, 32, true, true, shape{64, 8, "_d16"}, shape{64, 8, "_d16"}, shape{64, 8, "_d16"}},  // four rows
		{h200, 7168, 2048, 1, 1, 1, false, false, shape{64, 8, "_o4"}, shape{64, 8, "_o4"}, shape{64, 8, "_o4"}},     // a dense GEMV
		{h100, 24576, 1536, 1, 1, 1, false, false, shape{32, 8, "_d16"}, shape{32, 8, "_d16"}, shape{32, 8, "_d16"}}, // q_b: whole chunks a thread (OneRowWholeChunks)
		{h200, 8192, 1536, 1, 1, 1, false, false, shape{32, 8, "_d16"}, shape{32, 8, "_d16"}, shape{32, 8, "_d16"}},  // the indexer's wq_b
		{h200, 16384, 2048, 1, 1, 1, false, false, shape{64, 8, "_o4"}, shape{64, 8, "_o4"}, shape{64, 8, "_o4"}},    // GLM-5's q_b: 2 whole chunks at 64
		{h200, 7168, 2048, 4, 9, 8, false, true, shape{64, 8, ""}, shape{64, 8, ""}, shape{64, 8, ""}},               // several input rows a slot
	} {
		for _, mode := range []string{"on", "30", "off"} {
			OneRowExperts, ExpertDownG32, ExpertPair = mode != "off", mode == "30", ""
			want := map[string]shape{"on": cs.on, "30": cs.s30, "off": cs.off}[mode]
			if mode == "30" {
				ExpertPair = "o4"
			}
			ex := expertLaunch{slots: cs.slots, pairO4: expertPairO4(cs.card)}
			G, R, v := tileLaunchShape(132, cs.N, cs.K, cs.M, 1, cs.shapeAs, cs.pair, cs.routed, ex)
			if (shape{G, R, v}) != want {
				t.Errorf("%+v %s: G=%d R=%d %q, want %+v", cs, mode, G, R, v, want)
			}
		}
	}
	OneRowExperts, ExpertDownG32 = true, false
	OneRowWholeChunks = false
	if G, _, _ := tileLaunchShape(132, 24576, 1536, 1, 1, 1, false, false, expertLaunch{}); G != 64 {
		t.Errorf("OneRowWholeChunks off: q_b on G=%d, want the rule's 64", G)
	}
	if G, _, _ := tileLaunchShape(132, 24576, 1536, 2, 1, 2, false, false, expertLaunch{}); G != 64 {
		t.Errorf("two input rows: q_b on G=%d, want the rule's 64", G)
	}
	OneRowWholeChunks = true
	for _, c := range []struct {
		pair, card string
		want       bool
	}{{"", "NVIDIA H200", true}, {"", "NVIDIA H200 NVL", true}, {"", "NVIDIA H100 80GB HBM3", false}, {"", "", false},
		{"o4", "NVIDIA H100 80GB HBM3", true}, {"d16", "NVIDIA H200", false}} {
		ExpertPair = c.pair
		if got := expertPairO4(c.card); got != c.want {
			t.Errorf("ExpertPair=%q on %q: _o4 %v, want %v", c.pair, c.card, got, c.want)
		}
		if pair, _ := expertShapes(c.card); (pair == "_o4") != c.want {
			t.Errorf("ExpertPair=%q on %q: the log says the gate/up on %s", c.pair, c.card, pair)
		}
	}
	ExpertPair = ""
	for _, c := range []struct {
		on, d32          bool
		wantPair, wantDn string
	}{{true, false, "_o4", "groups of 32 where their last wave is fuller"}, {true, true, "_o4", "groups of 32"}, {false, false, "the tile rule's", "the tile rule's"}} {
		OneRowExperts, ExpertDownG32 = c.on, c.d32
		if pair, down := expertShapes("NVIDIA H200"); pair != c.wantPair || down != c.wantDn {
			t.Errorf("OneRowExperts %v, ExpertDownG32 %v: the log says %q, %q; want %q, %q", c.on, c.d32, pair, down, c.wantPair, c.wantDn)
		}
	}
}
