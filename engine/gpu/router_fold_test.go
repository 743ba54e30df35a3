package gpu

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/tilert-go/tilert/cuda"
	"github.com/tilert-go/tilert/cuda/kernels"
	"github.com/tilert-go/tilert/engine"
	"github.com/tilert-go/tilert/engine/internal/enginetest"
	"github.com/tilert-go/tilert/numeric"
)

// TestEmuRouterFold / TestGPURouterFold: with TILERT_GPU_ROUTER_FOLD=1 the
// greedy tokens equal the CPU engine's (MTP and not, one slot and two), every
// MoE layer is folded at load, and every routing of a run is the fused norm
// + routing (no moeRoute left); without it nothing is folded.
func TestEmuRouterFold(t *testing.T) { testRouterFold(t, onEmu) }
func TestGPURouterFold(t *testing.T) { testRouterFold(t, onGPU) }

func testRouterFold(t *testing.T, kind deviceKind) {
	if kind == onGPU {
		gpuDevice(t)
	}
	defer func(on bool) { routerFoldOn = on }(routerFoldOn)
	routerFoldOn = true
	testGreedyCases(t, kind, engine.CacheFP8DSMLA, genCases, " (TILERT_GPU_ROUTER_FOLD=1)")
	for _, pr := range enginetest.Presets {
		t.Run(pr, func(t *testing.T) {
			w, src := hfSourceOf(t, enginetest.PresetDir(t, pr))
			moe := 0
			for i := range w.Config().NumAllLayers() {
				if w.Config().IsMoELayer(i) {
					moe++
				}
			}
			prompt := enginetest.Prompt(40, w.Config().VocabSize, 5)
			for _, on := range []bool{false, true} {
				routerFoldOn = on
				e := newTestEngine(t, kind, src, engine.Options{MTP: true, MaxSeqLen: 80, Slots: 1})
				e.m.graphs.keep = [][]gop{}
				generateBatch(t, e, [][]int{prompt}, engine.Params{}, 6)
				folded, fused, routes := 0, 0, 0
				for _, lw := range e.m.w.layers {
					if lw.foldA.w != 0 && lw.foldM.w != 0 {
						folded++
					}
				}
				for _, run := range e.m.graphs.keep {
					for _, op := range run {
						switch op.name {
						case "addRMSNormRoute":
							fused++
						case "moeRoute":
							routes++
						}
					}
				}
				t.Logf("%s fold=%v: %d of %d MoE layers folded, %d fused norm + routing launches, %d routing launches", kind, on, folded, moe, fused, routes)
				if on && (folded != moe || fused == 0 || routes != 0) {
					t.Errorf("fold on: %d of %d MoE layers folded, %d fused launches, %d routing launches (want all, some, none)", folded, moe, fused, routes)
				}
				if !on && (folded != 0 || fused != 0 || routes == 0) {
					t.Errorf("fold off: %d layers folded, %d fused launches, %d routing launches (want 0, 0, some)", folded, fused, routes)
				}
			}
		})
	}
}

// TestRouterFoldLogits: the fold's arithmetic (the emulator's routerFold,
// which transcribes router_fold_a / _m) gives logits (A x + M v) / rms within
// float32 rounding of W_r rmsnorm(x + W_o v) w, computed in float64, on
// random layers with partial 128-blocks; a fold that drops the pairs' lo
// rows, or reads W_o transposed, is outside the bound.
func TestRouterFoldLogits(t *testing.T) {
	r := rand.New(rand.NewPCG(35, 1))
	for _, cs := range []struct{ E, H, K int }{{16, 192, 256}, {40, 300, 500}, {64, 256, 130}, {32, 160, 160}} {
		for _, wo := range []kernels.FoldKind{kernels.FoldFP8, kernels.FoldBF16, kernels.FoldF32} {
			t.Run(fmt.Sprintf("E=%d H=%d K=%d o_proj kind %d", cs.E, cs.H, cs.K, wo), func(t *testing.T) {
				ref, got, hiOnly, transposed := foldLogits(t, r, cs.E, cs.H, cs.K, wo)
				errOf := func(v []float64) float64 {
					var d, m float64
					for i := range ref {
						d, m = max(d, math.Abs(v[i]-ref[i])), max(m, math.Abs(ref[i]))
					}
					return d / m
				}
				const bound = 2e-5
				if e := errOf(got); !(e <= bound) {
					t.Errorf("folded logits: max|d|/max|ref| %.3g, bound %g", e, bound)
				} else {
					t.Logf("folded logits: max|d|/max|ref| %.3g (bound %g)", e, bound)
				}
				if e := errOf(hiOnly); e <= bound {
					t.Errorf("the pairs' hi rows alone pass the bound (%.3g): the check cannot see the lo rows", e)
				}
				if transposed != nil {
					if e := errOf(transposed); e <= bound {
						t.Errorf("W_o read transposed passes the bound (%.3g)", e)
					}
				}
			})
		}
	}
}

// foldLogits folds a random layer on the emulator and returns the float64
// reference logits, the folded ones, the folded ones from the hi rows only,
// and (square W_o only, else nil) the fold of W_o transposed.
func foldLogits(t *testing.T, r *rand.Rand, E, H, K int, woKind kernels.FoldKind) (ref, got, hiOnly, transposed []float64) {
	m := newEmu()
	up := func(b []byte) cuda.DevPtr {
		p, err := m.alloc(int64(len(b)))
		if err != nil {
			t.Fatal(err)
		}
		if err := m.upload(p, b); err != nil {
			t.Fatal(err)
		}
		return p
	}
	rnd := func(n int, s float64) []float32 {
		v := make([]float32, n)
		for i := range v {
			v[i] = float32(r.NormFloat64() * s)
		}
		return v
	}
	// The router in bf16, the norm weights near 1, W_o of the asked kind.
	wr := make([]uint16, E*H)
	for i := range wr {
		wr[i] = numeric.Float32ToBF16(float32(r.NormFloat64() * 0.05))
	}
	wrb := make([]byte, 2*len(wr))
	for i, v := range wr {
		wrb[2*i], wrb[2*i+1] = byte(v), byte(v>>8)
	}
	nw := rnd(H, 0.2)
	for i := range nw {
		nw[i] += 1
	}
	wod := make([]float64, H*K) // W_o as the kernels read it
	var woP, woS cuda.DevPtr
	switch woKind {
	case kernels.FoldFP8:
		kb := (K + 127) / 128
		sc := rnd(((H+127)/128)*kb, 0.001)
		for i := range sc {
			sc[i] = float32(math.Abs(float64(sc[i]))) + 0.0005
		}
		q := make([]byte, H*K)
		for i := range q {
			q[i] = numeric.Float32ToFP8E4M3(float32(r.NormFloat64() * 40))
			wod[i] = float64(numeric.FP8E4M3ToFloat32(q[i]) * sc[(i/K/128)*kb+(i%K)/128])
		}
		woP, woS = up(q), up(f32Bytes(sc))
	case kernels.FoldBF16:
		b := make([]byte, 2*H*K)
		for i := 0; i < H*K; i++ {
			v := numeric.Float32ToBF16(float32(r.NormFloat64() * 0.02))
			b[2*i], b[2*i+1] = byte(v), byte(v>>8)
			wod[i] = float64(numeric.BF16ToFloat32(v))
		}
		woP = up(b)
	default:
		v := rnd(H*K, 0.02)
		for i := range v {
			wod[i] = float64(v[i])
		}
		woP = up(f32Bytes(v))
	}
	fold := func(wo cuda.DevPtr) (a2, m2 []uint16) {
		a, err := m.alloc(int64(4 * E * H))
		if err != nil {
			t.Fatal(err)
		}
		pa, _ := m.alloc(int64(4 * E * H))
		pm, _ := m.alloc(int64(4 * E * K))
		if err := m.routerFold(a, pa, pm, up(wrb), kernels.FoldBF16, up(f32Bytes(nw)), wo, woS, woKind, E, H, K); err != nil {
			t.Fatal(err)
		}
		return m.u16(pa, 2*E*H), m.u16(pm, 2*E*K)
	}
	x, v := rnd(H, 1), rnd(K, 1)
	// The reference: h = w * (x + W_o v) / rms, logits = W_r h, in float64.
	xp := make([]float64, H)
	var ss float64
	for i := range xp {
		var o float64
		for k := range K {
			o += wod[i*K+k] * float64(v[k])
		}
		xp[i] = float64(x[i]) + o
		ss += xp[i] * xp[i]
	}
	inv := 1 / math.Sqrt(ss/float64(H)+1e-6)
	ref = make([]float64, E)
	for j := range E {
		for i := range H {
			ref[j] += float64(numeric.BF16ToFloat32(wr[j*H+i])) * float64(nw[i]) * xp[i] * inv
		}
	}
	logits := func(a2, m2 []uint16, lo bool) []float64 {
		out := make([]float64, E)
		for j := range E {
			var s float64
			for _, half := range []int{0, E} {
				if half == E && !lo {
					continue
				}
				for i := range H {
					s += float64(numeric.BF16ToFloat32(a2[(half+j)*H+i])) * float64(x[i])
				}
				for k := range K {
					s += float64(numeric.BF16ToFloat32(m2[(half+j)*K+k])) * float64(v[k])
				}
			}
			out[j] = s * inv
		}
		return out
	}
	a2, m2 := fold(woP)
	got, hiOnly = logits(a2, m2, true), logits(a2, m2, false)
	if H == K && woKind == kernels.FoldF32 {
		tv := make([]float32, H*K)
		for i := range H {
			for k := range K {
				tv[k*K+i] = float32(wod[i*K+k])
			}
		}
		ta2, tm2 := fold(up(f32Bytes(tv)))
		transposed = logits(ta2, tm2, true)
	}
	return ref, got, hiOnly, transposed
}

// TestEmuRouterFoldShardRanks: with TILERT_GPU_ROUTER_FOLD=1 a sharded
// engine's ranks keep the router GEMV (their forward is shard.go's, which
// does not run the fused norm + routing): no rank folds, and the sharded
// tokens equal the unsharded engine's with the fold.
func TestEmuRouterFoldShardRanks(t *testing.T) {
	defer func(on bool) { routerFoldOn = on }(routerFoldOn)
	routerFoldOn = true
	w, src := hfSourceOf(t, enginetest.PresetDir(t, enginetest.Presets[0]))
	opts := engine.Options{MaxSeqLen: maxSeq, Slots: 2}
	prompt := enginetest.Prompt(40, w.Config().VocabSize, 7)
	want := enginetest.Generate(t, newTestEngine(t, onEmu, src, opts), 0, prompt, engine.Params{}, genTokens)
	se := newShardTest(t, onEmu, src, opts, 2, CommLocal)
	for k, rk := range se.s.ranks {
		for i, lw := range rk.w.layers {
			if lw.foldA.w != 0 || lw.foldM.w != 0 {
				t.Errorf("rank %d layer %d: folded", k, i)
			}
		}
	}
	got := enginetest.Generate(t, se, 0, prompt, engine.Params{}, genTokens)
	if i := enginetest.FirstDiff(got, want); i >= 0 {
		t.Errorf("TP-2 tokens differ from the folded unsharded engine's at %d:\n got %v\nwant %v", i, got, want)
	}
}
