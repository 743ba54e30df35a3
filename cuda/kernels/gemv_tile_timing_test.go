package kernels

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/tilert-go/tilert/cuda"
)

// TestKernelTileTiming times the tile GEMVs on the decode shapes against
// what the engine ran before them (the shape-chosen wide or warp-per-row
// GEMV in chunks of 4 rows; the routed experts per row with separate gate,
// up, SwiGLU, down, combine and shared-expert launches), weights cold, and
// logs a sweep of group sizes and rows per group. Reported, never asserted.
func TestKernelTileTiming(t *testing.T) {
	needTiming(t)
	rule0 := TileRule
	defer func() { TileRule = rule0; forceTileG, forceTileR, forceTileV, forceTileB = 0, 0, "", 0 }()
	onGPU(t, func(c *cuda.Ctx, k *Set, a *allocs, r *rand.Rand) {
		s := c.Stream()
		add := timingTable(t, c, a, r, 1<<30, "tile: device-to-device copy 1 GiB (read+write)", "reference")
		// before: the engine's GEMV before the tile kernels, M rows in chunks of 4.
		before := func(y, x, w, sc cuda.DevPtr, N, K, M int) {
			for r0 := 0; r0 < M; r0 += 4 {
				m := min(4, M-r0)
				yy, xx := y.Add(int64(4*r0*N)), x.Add(int64(4*r0*K))
				if N <= 1024 {
					chk(k.GemvFP8Wide(s, yy, xx, w, sc, 0, N, K, m, K, N))
				} else {
					chk(k.GemvFP8(s, yy, xx, w, sc, 0, N, K, m, K, N))
				}
			}
		}
		// The engine took the wide experts kernel for at most 1024 rows x slots.
		beforeExperts := func(y, x cuda.DevPtr, xstride int, wt, st, ids cuda.DevPtr, slots, N, K int) {
			if N*slots <= 1024 {
				chk(k.GemvFP8ExpertsWide(s, y, x, xstride, wt, st, ids, slots, N, K))
			} else {
				chk(k.GemvFP8Experts(s, y, x, xstride, wt, st, ids, slots, N, K))
			}
		}
		dense := func(N, K int, what string) {
			nsc := cdiv(N, 128) * cdiv(K, 128)
			nc := coldCopies(int64(N * K))
			ws, ss := devFP8s(c, a, r, nc, N, K)
			x := a.up(randF32(r, MaxTileM*K, 1))
			y := a.raw(int64(4 * MaxTileM * N))
			i := 0
			bytes := func(M int) float64 { return float64(N*K + 4*nsc + 4*M*(K+N)) }
			var one float64
			for _, M := range []int{1, 4, 8} {
				old := medianUs(c, s, 2*nc, 11, func() { before(y, x, ws[i%nc], ss[i%nc], N, K, M); i++ })
				add(fmtName("before N=%d K=%d M=%d cold", N, K, M), bytes(M), old, what)
				for _, rule := range []int{1, 2, 3} {
					TileRule = rule
					us := medianUs(c, s, 2*nc, 11, func() { chk(k.GemvFP8Tile(s, y, x, ws[i%nc], ss[i%nc], 0, N, K, M, K, N)); i++ })
					G, R := tileShape(k.c.Info().SMs, N, K, M, 1, false)
					if M == 1 && rule == 1 {
						one = us
					}
					add(fmtName("gemv_tile_fp8 N=%d K=%d M=%d cold rule %d G=%d R=%d%s", N, K, M, rule, G, R, tileVariant(G, R, K, M, 1)), bytes(M), us,
						fmtName("%.2fx before, %.2fx M=1 rule 1", old/us, us/one))
				}
				TileRule = rule0
			}
			// Sweep (logged only): which group size, rows per group and
			// variant stream best.
			line := ""
			for _, g := range []int{32, 64, 128, 256} {
				for _, rr := range []int{1, 2, 4, 8} {
					for _, v := range tileVariants {
						if (v == "_d16" && rr < 2) || (v == "_o4" && rr < 4) {
							continue
						}
						for _, b := range []int{0, 2, 4} {
							if b > 0 && rr < 4 {
								continue
							}
							forceTileG, forceTileR, forceTileV, forceTileB = g, rr, v, b
							if v == "" {
								forceTileV = "-"
							}
							us := medianUs(c, s, 2*nc, 5, func() { chk(k.GemvFP8Tile(s, y, x, ws[i%nc], ss[i%nc], 0, N, K, 1, K, N)); i++ })
							line += fmt.Sprintf(" G%d/R%d%s/B%d:%.1f", g, rr, v, b, us)
						}
					}
				}
			}
			forceTileV, forceTileB = "", 0
			for _, M := range []int{4, 8} {
				G, _ := tileShape(k.c.Info().SMs, N, K, M, 1, false)
				line += fmt.Sprintf(" | M=%d G=%d", M, G)
				for _, rr := range []int{2, 4, 8} {
					if rr*M > 32 {
						continue
					}
					forceTileG, forceTileR = G, rr
					us := medianUs(c, s, 2*nc, 5, func() { chk(k.GemvFP8Tile(s, y, x, ws[i%nc], ss[i%nc], 0, N, K, M, K, N)); i++ })
					line += fmt.Sprintf(" R%d:%.1f", rr, us)
				}
			}
			forceTileG, forceTileR = 0, 0
			t.Logf("sweep N=%d K=%d M=1 (then M=4, 8) us:%s", N, K, line)
		}
		dense(7168, 16384, "o_proj")
		dense(24576, 1536, "q_b")
		dense(8192, 1536, "indexer wq_b")
		dense(1536, 7168, "q_a")
		dense(576, 7168, "kv_a")
		dense(18432, 7168, "dense gate/up")
		dense(7168, 18432, "dense down")
		bf16 := func(N, K int, what string) {
			nc := coldCopies(int64(2 * N * K))
			ws := devBF16s(c, a, r, nc, N, K)
			x := a.up(randF32(r, 8*K, 1))
			y := a.raw(int64(4 * 8 * N))
			i := 0
			// The bf16 tile kernels take 5..8 rows (GemvBF16TileMinM); the
			// wide ones at most 4, so M rows are ceil(M/4) wide launches
			// (the engine's rows4).
			for _, M := range []int{5, 8} {
				bytes := float64(2*N*K + 4*M*(K+N))
				old := medianUs(c, s, 2*nc, 11, func() {
					for m := 0; m < M; m += 4 {
						chk(k.GemvBF16Wide(s, y.Add(int64(4*m*N)), x.Add(int64(4*m*K)), ws[i%nc], 0, N, K, min(4, M-m), K, N))
					}
					i++
				})
				add(fmtName("gemv_bf16_wide N=%d K=%d M=%d cold", N, K, M), bytes, old, what)
				us := medianUs(c, s, 2*nc, 11, func() { chk(k.GemvBF16Tile(s, y, x, ws[i%nc], 0, N, K, M, K, N)); i++ })
				add(fmtName("gemv_tile_bf16 N=%d K=%d M=%d cold", N, K, M), bytes, us, fmtName("%.2fx wide", old/us))
			}
		}
		bf16(256, 7168, "router")
		bf16(64, 7168, "indexer weights_proj")
		// A MoE layer's experts for M rows: before (per row: gate, up,
		// SwiGLU, down, combine; the shared expert's gate, up, SwiGLU, down;
		// the add) against three launches (gate-up of all slots and the
		// shared expert, down likewise, the combine).
		moe := func(E, top, H, I int, Ms []int, what string) {
			mk := func(n, kk int) (tw, ts cuda.DevPtr, sw, ss cuda.DevPtr) {
				wt, st := devFP8s(c, a, r, E+1, n, kk)
				return a.up(wt[:E]), a.up(st[:E]), wt[E], st[E]
			}
			gT, gS, gW, gSW := mk(I, H)
			uT, uS, uW, uSW := mk(I, H)
			dT, dS, dW, dSW := mk(H, I)
			const sets = 16
			maxM := Ms[len(Ms)-1]
			idps := make([]cuda.DevPtr, sets)
			for i := range idps {
				ids := make([]int32, maxM*top)
				for m := range maxM {
					for j, e := range r.Perm(E)[:top] {
						ids[m*top+j] = int32(e)
					}
				}
				idps[i] = a.up(ids)
			}
			wts := a.up(randF32(r, maxM*top, 0.3))
			h := a.up(randF32(r, maxM*H, 1))
			eg, eu := a.raw(int64(4*(maxM+1)*top*I)), a.raw(int64(4*(maxM+1)*top*I))
			ey := a.raw(int64(4 * (maxM + 1) * (top + 1) * H))
			sg, su, sy := a.raw(int64(4*maxM*I)), a.raw(int64(4*maxM*I)), a.raw(int64(4*maxM*H))
			mo := a.raw(int64(4 * maxM * H))
			var one float64
			for _, M := range Ms {
				slots := M * top
				// distinct experts touched are counted once, as the floor does
				bytes := float64(M*(top+1)*3*I*H) + 4*float64(M*H)
				i := 0
				old := medianUs(c, s, sets, 11, func() {
					ids := idps[i%sets]
					for m := range M {
						hx, id := h.Add(int64(4*m*H)), ids.Add(int64(4*m*top))
						beforeExperts(eg, hx, 0, gT, gS, id, top, I, H)
						beforeExperts(eu, hx, 0, uT, uS, id, top, I, H)
						chk(k.SiluMul(s, eg, eg, eu, top, I, I, I, I))
						beforeExperts(ey, eg, I, dT, dS, id, top, H, I)
						chk(k.MoECombine(s, mo.Add(int64(4*m*H)), ey, wts.Add(int64(4*m*top)), 0, top, H))
					}
					before(sg, h, gW, gSW, I, H, M)
					before(su, h, uW, uSW, I, H, M)
					chk(k.SiluMul(s, sg, sg, su, M, I, I, I, I))
					before(sy, sg, dW, dSW, H, I, M)
					chk(k.Add(s, mo, mo, sy, M*H))
					i++
				})
				add(fmtName("before: MoE experts %d of %d +shared, M=%d, H=%d I=%d", top, E, M, H, I), bytes, old, what)
				guF := func() {
					chk(k.ExpertsFP8(s, eg, h, H, top, 0, [2]cuda.DevPtr{gT, uT}, [2]cuda.DevPtr{gS, uS}, idps[i%sets], slots,
						[2]cuda.DevPtr{gW, uW}, [2]cuda.DevPtr{gSW, uSW}, M, I, H))
				}
				dnF := func() {
					chk(k.ExpertsFP8(s, ey, eg, I, 1, slots, [2]cuda.DevPtr{dT}, [2]cuda.DevPtr{dS}, idps[i%sets], slots,
						[2]cuda.DevPtr{dW}, [2]cuda.DevPtr{dSW}, M, H, I))
				}
				for _, rule := range []int{1, 2, 3} {
					TileRule = rule
					us := medianUs(c, s, sets, 11, func() {
						guF()
						dnF()
						chk(k.MoECombineSlots(s, mo, ey, wts, ey.Add(int64(4*slots*H)), M, top, H))
						i++
					})
					if M == 1 && rule == 1 {
						one = us
					}
					add(fmtName("tile rule %d: MoE experts %d of %d +shared, M=%d, H=%d I=%d (3 launches)", rule, top, E, M, H, I), bytes, us,
						fmtName("%.2fx before, %.2fx M=1 rule 1", old/us, us/one))
					gu := medianUs(c, s, sets, 11, func() { guF(); i++ })
					G, R, v := tileLaunchShape(k.c.Info().SMs, I, H, 1, 1, slots+M, true, false, expertLaunch{})
					add(fmtName("  of which gate-up+SwiGLU, %d slots G=%d R=%d%s", slots+M, G, R, v), float64((slots+M)*2*I*H), gu, "")
					dn := medianUs(c, s, sets, 11, func() { dnF(); i++ })
					G, R, v = tileLaunchShape(k.c.Info().SMs, H, I, 1, 1, slots+M, false, false, expertLaunch{})
					add(fmtName("  of which down, %d slots G=%d R=%d%s", slots+M, G, R, v), float64((slots+M)*I*H), dn, "")
					cb := medianUs(c, s, sets, 11, func() {
						chk(k.MoECombineSlots(s, mo, ey, wts, ey.Add(int64(4*slots*H)), M, top, H))
						i++
					})
					add(fmtName("  of which combine, %d rows", M), float64(4*(slots+2*M)*H), cb, "")
				}
				TileRule = rule0
				// Sweep (logged only): group size x rows per group x variant
				// x blocks per SM (0: a block per row tile).
				for pi, f := range []func(){guF, dnF} {
					if M > 4 {
						break
					}
					line := ""
					for _, g := range []int{32, 64, 128, 256} {
						for _, rr := range []int{2, 4, 8} {
							for _, v := range tileVariants {
								for _, b := range []int{0, 2, 4} {
									if v == "_o4" && rr < 4 {
										continue
									}
									forceTileG, forceTileR, forceTileV, forceTileB = g, rr, v, b
									if v == "" {
										forceTileV = "-"
									}
									us := medianUs(c, s, sets, 5, func() { f(); i++ })
									line += fmt.Sprintf(" G%d/R%d%s/B%d:%.1f", g, rr, v, b, us)
								}
							}
						}
					}
					forceTileG, forceTileR, forceTileV, forceTileB = 0, 0, "", 0
					t.Logf("experts sweep %s M=%d slots=%d H=%d I=%d us:%s", []string{"gate-up", "down"}[pi], M, slots+M, H, I, line)
				}
			}
		}
		moe(64, 8, 7168, 2048, []int{1, 4, 8}, "DeepSeek-V3.2 routed + shared (64 experts: past L2)")
		moe(256, 8, 7168, 256, []int{1, 4}, "TP-8 shard (I=256)")
	})
}
