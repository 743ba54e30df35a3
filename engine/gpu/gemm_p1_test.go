package gpu

import (
	"fmt"
	"math"
	"testing"

	"github.com/tilert-go/tilert/engine"
	"github.com/tilert-go/tilert/engine/internal/enginetest"
)

// The engine checks of the one-part prefill (TILERT_GPU_GEMM=1
// TILERT_GPU_GEMM_SPLITS=1, serving mode): x rounded once in every prefill
// GEMM (fp16 after a power-of-two row scale in gemm_p1.cu, bf16 in
// gemm_tc's s1 kernels), as HF and vLLM run prefill in bf16. Its caches
// and logits cannot equal the CPU's float32 forward bit for bit, so:
//   - greedy == CPU serving on the prompts that still run as GEMVs (fewer
//     than gemmMinRows rows: the switch must not leak into decode);
//   - prefill caches vs the CPU's, value by value after dequantising
//     (testCachesP1);
//   - serving quality: teacher-forced logits against the CPU's float32
//     forward (the emulator at 3 parts) and against the emulated one-part
//     forward (testLogitsP1).
// Exact mode keeps its 3 parts whatever the switch says
// (TestGemmPartsExactMode).

// withP1 is withGemm with one part of x in serving mode.
func withP1(t *testing.T) {
	withGemm(t)
	old := gemmSplits
	gemmSplits = 1
	t.Cleanup(func() { gemmSplits = old })
}

// shortCases is genCases' prompts that run as GEMVs (< gemmMinRows rows).
func shortCases(vocab int) []genCase {
	var out []genCase
	for _, c := range genCases(vocab) {
		if len(c.prompt) < gemmMinRows {
			out = append(out, c)
		}
	}
	return out
}

func TestEmuPrefillGemmP1Greedy(t *testing.T) {
	withP1(t)
	testGreedyCases(t, onEmu, engine.CacheFP8DSMLA, shortCases, " (one-part GEMMs on, GEMV-length prompts)")
}

func TestGPUPrefillGemmP1Greedy(t *testing.T) {
	withP1(t)
	testGreedyCases(t, onGPU, engine.CacheFP8DSMLA, shortCases, " (one-part GEMMs on, GEMV-length prompts)")
}

// TestGemmPartsExactMode pins where the parts are decided: exact mode
// always 3 (float32-exact products for the HF-golden checks), serving mode
// the switch.
func TestGemmPartsExactMode(t *testing.T) {
	old := gemmSplits
	t.Cleanup(func() { gemmSplits = old })
	_, src := hfSourceOf(t, enginetest.PresetDir(t, enginetest.Presets[0]))
	for _, sp := range []int{1, 2, 3} {
		gemmSplits = sp
		for _, mode := range []engine.Mode{engine.ModeServing, engine.ModeExact} {
			e := newTestEngine(t, onEmu, src, engine.Options{MaxSeqLen: maxSeq, Mode: mode})
			want := sp
			if mode == engine.ModeExact {
				want = 3
			}
			if got := e.m.gemmParts(); got != want {
				t.Errorf("TILERT_GPU_GEMM_SPLITS=%d, %s mode: %d parts, want %d", sp, mode, got, want)
			}
			// The forward's ops take the backend's parts (beginMeta).
			o := &ops{}
			_ = e.m.begin(o, nil) // zero rows: an error, after the parts are set
			if o.parts != want {
				t.Errorf("TILERT_GPU_GEMM_SPLITS=%d, %s mode: the forward's ops carry %d parts, want %d", sp, mode, o.parts, want)
			}
		}
	}
}

// TestEmuPrefillGemmP1Caches runs the cache comparison with the
// emulator's transcription of the one-part rounding (CI).
// TestForwardParts pins forwardParts: one part only where a slot forwards
// a prompt chunk (>= gemmMinRows consecutive positions).
func TestForwardParts(t *testing.T) {
	dec := make([]group, 20) // 20 slots of 1 row: a GEMM of 20 rows, decode
	for i := range dec {
		dec[i] = group{first: i, n: 1}
	}
	mtp := []group{{n: 3}, {first: 3, n: 3}, {first: 6, n: 3}, {first: 9, n: 3}, {first: 12, n: 3}, {first: 15, n: 3}}
	for _, c := range []struct {
		parts  int
		groups []group
		want   int
	}{
		{1, []group{{n: 48}}, 1}, {1, []group{{n: gemmMinRows}}, 1}, {1, append([]group{{n: 2}}, group{first: 2, n: 30}), 1},
		{1, dec, 3}, {1, mtp, 3}, {1, []group{{n: gemmMinRows - 1}}, 3}, {3, []group{{n: 48}}, 3}, {2, dec, 2},
	} {
		if got := forwardParts(c.parts, c.groups); got != c.want {
			t.Errorf("parts %d, %d groups (first %d rows): %d, want %d", c.parts, len(c.groups), c.groups[0].n, got, c.want)
		}
	}
}

func TestEmuPrefillGemmP1Caches(t *testing.T) {
	withP1(t)
	testCachesP1(t, onEmu)
}

func TestGPUPrefillGemmP1Caches(t *testing.T) {
	withP1(t)
	testCachesP1(t, onGPU)
}

// Cache bounds of the one-part prefill. The byte-equality metric of
// testCachesMatchCPU does not fit it: x's rounding (2^-11 relative per
// value) moves a GEMM output by ~2^-12 of the output's size, so a value
// crosses an fp8 rounding boundary with probability ~ (that error) / (its
// fp8 step), far more often than float32 summation order does, and the
// tiny random presets amplify any perturbation from layer to layer (DESIGN
// known traps: their MoE routing and the indexer's top-k flip at near-ties;
// on the emulator, noise of 2^-11 on every GEMM output moves ~30% of the
// last layer's cache values). So each dequantised value is compared:
//   - beyond one step: |gpu - cpu| > max(one quantisation step of the
//     larger of the two, 2^-8 of its 128-group's largest |value|) (fp8
//     e4m3: step <= 2^-3 of the value, or the subnormal step, 2^-9 of the
//     group's scale, at most 2 amax/448; bf16: 2^-7 of the value). The 2^-8
//     of the group's largest is 8x a one-rounding GEMM error: values near
//     zero (a RoPE rotation's difference, a normed latent near 0) see the
//     absolute error of their group, not one relative to themselves;
//   - differing at all (any value whose bytes changed).
//
// Both fractions must stay within p1NoiseFactor x what the emulator does
// with every GEMM/GEMV output nudged by 2^-11 (one fp16 rounding: the same
// prefill at 3 parts, compared with the CPU the same way), and at least
// the floors below; the first layer (one GEMM deep from the embeddings:
// no routing or top-k decision upstream) must be within
// p1Layer0BeyondBound by itself. A real bug (wrong rows, K permutation,
// scale or tail) moves most values of every layer by many steps.
const (
	p1NoiseFactor       = 1.5
	p1BeyondFloor       = 0.01
	p1DifferFloor       = 0.05
	p1Layer0BeyondBound = 0.002
)

type cacheDiff struct{ vals, differ, beyond int }

func (d cacheDiff) add(o cacheDiff) cacheDiff {
	return cacheDiff{d.vals + o.vals, d.differ + o.differ, d.beyond + o.beyond}
}
func (d cacheDiff) beyondFrac() float64 { return float64(d.beyond) / float64(max(d.vals, 1)) }
func (d cacheDiff) differFrac() float64 { return float64(d.differ) / float64(max(d.vals, 1)) }

// prefillExport prefills prompt into slot 0 of e and exports it.
func prefillExport(t *testing.T, e engine.Engine, prompt []int) (int, []engine.Segment) {
	t.Helper()
	f, err := e.Prefill(0, prompt, engine.Params{})
	if err != nil {
		t.Fatalf("%+v", err)
	}
	_, segs, err := e.Export(0)
	if err != nil {
		t.Fatalf("%+v", err)
	}
	return f, segs
}

// compareCaches compares two exports of layout lay region by region: per
// region and over all, and the first layer's regions apart.
func compareCaches(t *testing.T, lay engine.Layout, s1, s2 []engine.Segment, logf bool) (all, first cacheDiff) {
	t.Helper()
	if len(s1) != len(s2) {
		t.Fatalf("%d segments, CPU %d", len(s2), len(s1))
	}
	for i := range s1 {
		if s1[i].Offset != s2[i].Offset || len(s1[i].Data) != len(s2[i].Data) {
			t.Fatalf("segment %d at %d+%d, CPU %d+%d", i, s2[i].Offset, len(s2[i].Data), s1[i].Offset, len(s1[i].Data))
		}
		r := lay.Regions[i]
		d := compareRegion(lay, r, s1[i].Data, s2[i].Data)
		if logf {
			t.Logf("layer %d %s: %d values, %d differ, %d beyond one step", r.Layer, r.Kind, d.vals, d.differ, d.beyond)
		}
		all = all.add(d)
		if r.Layer == 0 {
			first = first.add(d)
		}
	}
	return all, first
}

// testCachesP1 prefills the long prompt on both engines (the one under
// test in 48-row GEMM chunks with one part) and compares the exported
// caches value by value (above), against the noise baseline.
func testCachesP1(t *testing.T, kind deviceKind) {
	if kind == onGPU {
		gpuDevice(t)
	}
	pinModelledPrefill(t)
	testCachesOnePart(t, kind, "")
}

// testCachesOnePart is testCachesP1 with the prefill switches as they are
// (the caller pins them; tag names the combination in the rows). On the
// GPU two more comparisons: the bounds against the CPU also take
// p1NoiseFactor x what the emulated one-part forward (the same roundings,
// transcribed) moves from the CPU, and the GPU's caches are compared value
// by value with the emulated one-part forward's, against p1NoiseFactor x
// what float32-sized noise (noiseLevel on every GEMM, absorb and MLA
// output of the emulated one-part forward: the GPU's summation order, which
// flips an fp16 rounding now and then) moves them, and the floors.
func testCachesOnePart(t *testing.T, kind deviceKind, tag string) {
	old := gemmSplits
	t.Cleanup(func() { gemmSplits = old })
	for _, pr := range enginetest.Presets {
		t.Run(pr, func(t *testing.T) {
			w, src := hfSourceOf(t, enginetest.PresetDir(t, pr))
			opts := engine.Options{MTP: true, MaxSeqLen: maxSeq}
			ce := newCPU(t, w, opts)
			prompt := genCases(w.Config().VocabSize)[1].prompt
			f1, s1 := prefillExport(t, ce, prompt)
			// The baseline: 3 parts, every output nudged by one fp16 rounding.
			gemmSplits = 3
			nb, err := build(&noisyRunner{m: &noisyEmu{emuDevice: newEmu(), level: 1.0 / 2048}}, src, opts)
			if err != nil {
				t.Fatal(err)
			}
			defer nb.Close()
			_, sn := prefillExport(t, nb, prompt)
			base, base0 := compareCaches(t, nb.Layout(), s1, sn, false)
			gemmSplits = 1
			ge := newTestEngine(t, kind, src, opts)
			if got := ge.m.gemmParts(); got != 1 {
				t.Fatalf("serving engine with the switch on: %d parts", got)
			}
			f2, s2 := prefillExport(t, ge, prompt)
			if f1 != f2 {
				t.Logf("first token %d, CPU %d (not enforced here: the logits check judges quality)", f2, f1)
			}
			all, first := compareCaches(t, ge.Layout(), s1, s2, true)
			if all.vals == 0 || first.vals == 0 {
				t.Fatal("no cache values compared")
			}
			t.Logf("noise baseline (2^-11 on every output): beyond %.4f, differing %.4f, first layer beyond %.4f",
				base.beyondFrac(), base.differFrac(), base0.beyondFrac())
			beyondB, differB := max(p1BeyondFloor, p1NoiseFactor*base.beyondFrac()), max(p1DifferFloor, p1NoiseFactor*base.differFrac())
			var se []engine.Segment
			if kind != onEmu {
				_, se = prefillExport(t, newTestEngine(t, onEmu, src, opts), prompt)
				eff, _ := compareCaches(t, ge.Layout(), s1, se, false)
				t.Logf("emulated one-part vs CPU: beyond %.4f, differing %.4f", eff.beyondFrac(), eff.differFrac())
				beyondB = max(beyondB, p1NoiseFactor*eff.beyondFrac())
				differB = max(differB, min(1, p1NoiseFactor*eff.differFrac()))
			}
			name := fmt.Sprintf("%s %s one-part prefill caches vs CPU%s", kind, pr, tag)
			recordP1(t, kind, tag, name, "fraction of values beyond one step", all.beyondFrac(), beyondB)
			recordP1(t, kind, tag, name, "fraction of values differing", all.differFrac(), differB)
			record(t, name+", first layer", "fraction of values beyond one step", first.beyondFrac(), p1Layer0BeyondBound)
			if kind == onEmu {
				return
			}
			// The noise baseline: the emulated one-part forward against itself
			// nudged, the largest effect of p1NoiseSeeds nudge patterns (one
			// pattern is one draw of a chaotic process: on the H200 the GPU
			// landed at 1.6x one draw's "beyond" fraction).
			nzBeyond, nzDiffer := 0.0, 0.0
			for _, seed := range p1NoiseSeeds {
				nb1, err := build(&noisyRunner{m: &noisyEmu{emuDevice: newEmu(), n: seed}}, src, opts)
				if err != nil {
					t.Fatal(err)
				}
				_, sn1 := prefillExport(t, nb1, prompt)
				nz, _ := compareCaches(t, ge.Layout(), se, sn1, false)
				if err := nb1.Close(); err != nil {
					t.Error(err)
				}
				t.Logf("emulated one-part vs itself nudged by %.0e (seed %#x): beyond %.4f, differing %.4f", noiseLevel, seed, nz.beyondFrac(), nz.differFrac())
				nzBeyond, nzDiffer = max(nzBeyond, nz.beyondFrac()), max(nzDiffer, nz.differFrac())
			}
			t.Logf("%s vs emulated one-part, per region:", kind)
			ge1, ge10 := compareCaches(t, ge.Layout(), se, s2, true)
			name = fmt.Sprintf("%s %s one-part prefill caches vs emulated one-part%s", kind, pr, tag)
			record(t, name, "fraction of values beyond one step", ge1.beyondFrac(), max(p1BeyondFloor, p1NoiseFactor*nzBeyond))
			record(t, name, "fraction of values differing", ge1.differFrac(), max(p1DifferFloor, min(1, p1NoiseFactor*nzDiffer)))
			// The first layer's caches come from GEMMs of the embeddings alone:
			// the same roundings on both sides, only summation order apart.
			record(t, name+", first layer", "fraction of values beyond one step", ge10.beyondFrac(), p1Layer0BeyondBound)
		})
	}
}

// compareRegion dequantises one exported region on both sides (token
// entries where either side is nonzero) and counts values that differ and
// values beyond one step.
func compareRegion(lay engine.Layout, r engine.Region, a, b []byte) cacheDiff {
	var d cacheDiff
	R, P, D := lay.KVLoraRank, lay.RopeDim, lay.IndexHeadDim
	cmp := func(x, y []float32, fp8 bool) {
		zero := true
		for i := range x {
			zero = zero && x[i] == 0 && y[i] == 0
		}
		if zero {
			return
		}
		for g := 0; g < len(x); g += 128 {
			hi := min(g+128, len(x))
			var amax float64
			for i := g; i < hi; i++ {
				amax = math.Max(amax, math.Max(math.Abs(float64(x[i])), math.Abs(float64(y[i]))))
			}
			for i := g; i < hi; i++ {
				d.vals++
				if x[i] == y[i] {
					continue
				}
				d.differ++
				m := math.Max(math.Abs(float64(x[i])), math.Abs(float64(y[i])))
				tol := math.Ldexp(m, -7)
				if fp8 {
					tol = math.Max(math.Ldexp(m, -3), math.Ldexp(2*amax/448, -9))
				}
				tol = math.Max(tol, math.Ldexp(amax, -8))
				if math.Abs(float64(x[i])-float64(y[i])) > tol*(1+1e-6) {
					d.beyond++
				}
			}
		}
	}
	switch r.Kind {
	case engine.RegionMLA:
		n := len(a) / lay.MLATokenBytes
		la, pa, lb, pb := make([]float32, R), make([]float32, P), make([]float32, R), make([]float32, P)
		for p := 0; p < n; p++ {
			ea, eb := a[p*lay.MLATokenBytes:], b[p*lay.MLATokenBytes:]
			fp8 := lay.MLACache != engine.CacheBF16
			if fp8 {
				engine.DecodeMLAFP8(la, pa, ea)
				engine.DecodeMLAFP8(lb, pb, eb)
			} else {
				engine.DecodeMLABF16(la, pa, ea)
				engine.DecodeMLABF16(lb, pb, eb)
			}
			cmp(la, lb, fp8)
			cmp(pa, pb, false)
		}
	case engine.RegionIndexer:
		ka, kb := make([]float32, D), make([]float32, D)
		for pg := 0; (pg+1)*r.PageBytes <= len(a); pg++ {
			for tk := 0; tk < engine.BlockSize; tk++ {
				engine.DecodeIndexerKey(ka, a[pg*r.PageBytes:(pg+1)*r.PageBytes], tk)
				engine.DecodeIndexerKey(kb, b[pg*r.PageBytes:(pg+1)*r.PageBytes], tk)
				cmp(ka, kb, true)
			}
		}
	}
	return d
}

func TestGPUPrefillGemmP1Logits(t *testing.T) {
	gpuDevice(t)
	testLogitsP1(t, onGPU)
}

// TestEmuPrefillGemmP1Logits runs the same comparison with the emulator's
// transcription of the one-part rounding in place of the GPU (CI: the
// figures the GPU's check is judged against).
func TestEmuPrefillGemmP1Logits(t *testing.T) { testLogitsP1(t, onEmu) }

// Logit bounds of the one-part prefill (serving quality), teacher-forced
// over 100 tokens (48-row GEMM chunks):
//   - vs the CPU's float32 forward (the emulator with 3 parts): the median
//     position's max|d|/max|ref| within max(2^-7, p1NoiseFactor x the
//     median of the noise baseline: the emulator at 3 parts with every
//     GEMV/GEMM output nudged by 2^-11, one fp16 rounding). 2^-7 is one bf16
//     rounding, what a trained model's prefill in bf16 stays within; the
//     tiny random presets amplify any perturbation far past it (on the
//     emulator the transcribed one-part rounding moves the median position
//     by 0.039 / 0.021 and the 2^-11 noise by 0.043 / 0.032: DESIGN known
//     traps), so the baseline sets the bound there. A real kernel bug moves
//     every position by O(1);
//   - positions beyond flipErr and top-1 changes: at most flipFraction or
//     the same baseline's;
//   - GPU vs the emulated one-part forward (the same rounding transcribed):
//     TestGPULogitsMatchEmulator's float32 bounds (medianBound, flipFraction)
//     or what float32-sized noise (noiseLevel) does to the emulated one-part
//     forward, if more: the kernels round x as intended.
const p1MedianBound = 1.0 / 128

func testLogitsP1(t *testing.T, kind deviceKind) {
	withGemm(t)
	pinModelledPrefill(t)
	testLogitsOnePart(t, kind, "")
}

// testLogitsOnePart is testLogitsP1 with the prefill switches as they are
// (the caller pins them); tag names the combination in the rows. The
// bounds against the CPU's float32 forward also take p1NoiseFactor x what
// the emulated one-part forward (the same roundings, transcribed) moves
// from it: the size of the roundings' own effect on the tiny random
// models, which the nudge baseline (one fp16 rounding of every GEMM
// output) underestimates once the absorbs and the MLA prefill round too.
// On the emulator those rows keep the nudge baseline alone (there the
// engine under test is the emulated forward itself).
func testLogitsOnePart(t *testing.T, kind deviceKind, tag string) {
	old := gemmSplits
	t.Cleanup(func() { gemmSplits = old })
	for _, pr := range enginetest.Presets {
		t.Run(pr, func(t *testing.T) {
			w, src := hfSourceOf(t, enginetest.PresetDir(t, pr))
			opts := engine.Options{MaxSeqLen: maxSeq}
			toks := enginetest.Prompt(100, w.Config().VocabSize, 5)
			// References first, at 3 parts: the float32 forward and the
			// one-rounding noise baseline.
			gemmSplits = 3
			ee := newTestEngine(t, onEmu, src, opts)
			el, em, err := ee.TeacherForce(0, toks)
			if err != nil {
				t.Fatalf("%+v", err)
			}
			base := noiseBaselineAt(t, src, toks, el, em, 1.0/2048)
			// The one-part runs: emulated, then the engine under test.
			gemmSplits = 1
			e1 := newTestEngine(t, onEmu, src, opts)
			l1, m1, err := e1.TeacherForce(0, toks)
			if err != nil {
				t.Fatalf("%+v", err)
			}
			// float32-sized noise on the one-part forward (its fp16 roundings
			// then flip where an input sits on a boundary, as on the GPU).
			// The one-part forward's own noise: the largest effect of
			// p1NoiseSeeds nudge patterns (see the caches' check).
			var base1Med, base1Big, base1Dis float64
			for _, seed := range p1NoiseSeeds {
				b := noiseBaselineSeed(t, src, toks, l1, m1, 0, seed)
				base1Med, base1Big, base1Dis = max(base1Med, b.quantile(0.5)), max(base1Big, b.bigFrac()), max(base1Dis, b.disFrac())
			}
			ge := newTestEngine(t, kind, src, opts)
			if got := ge.m.gemmParts(); got != 1 {
				t.Fatalf("serving engine with the switch on: %d parts", got)
			}
			gl, gm, err := ge.TeacherForce(0, toks)
			if err != nil {
				t.Fatalf("%+v", err)
			}
			st := compareRuns(el, em, gl, gm)
			t.Logf("%s one-part vs float32 forward over %d main + %d MTP positions: p50 %.3g p90 %.3g max %.3g; > %.0e: %d; top-1 changed %d",
				kind, st.nMain, len(st.errs)-st.nMain, st.quantile(0.5), st.quantile(0.9), st.quantile(1), flipErr, st.big, st.dis)
			t.Logf("baseline, outputs nudged by 2^-11: p50 %.3g; > %.0e: %d; top-1 changed %d", base.quantile(0.5), flipErr, base.big, base.dis)
			name := fmt.Sprintf("%s %s one-part prefill logits vs CPU float32 forward%s", kind, pr, tag)
			medB, bigB, disB := max(p1MedianBound, p1NoiseFactor*base.quantile(0.5)), max(flipFraction, base.bigFrac()), max(flipFraction, base.disFrac())
			if kind != onEmu {
				se := compareRuns(el, em, l1, m1)
				t.Logf("emulated one-part vs float32 forward: p50 %.3g; > %.0e: %d; top-1 changed %d", se.quantile(0.5), flipErr, se.big, se.dis)
				medB = max(medB, p1NoiseFactor*se.quantile(0.5))
				bigB = max(bigB, min(1, p1NoiseFactor*se.bigFrac()))
				disB = max(disB, p1NoiseFactor*se.disFrac())
			}
			recordP1(t, kind, tag, name, "median max|d|/max|ref|", st.quantile(0.5), medB)
			recordP1(t, kind, tag, name, fmt.Sprintf("positions with err > %.0e", flipErr), st.bigFrac(), bigB)
			recordP1(t, kind, tag, name, "top-1 disagreeing", st.disFrac(), disB)
			t.Logf("baseline, one-part forward nudged by %.0e (largest of %d patterns): p50 %.3g; > %.0e: %.3g; top-1 changed %.3g",
				noiseLevel, len(p1NoiseSeeds), base1Med, flipErr, base1Big, base1Dis)
			if kind == onEmu {
				return
			}
			s1 := compareRuns(l1, m1, gl, gm)
			t.Logf("gpu one-part vs emulated one-part: p50 %.3g max %.3g; > %.0e: %d; top-1 changed %d", s1.quantile(0.5), s1.quantile(1), flipErr, s1.big, s1.dis)
			tag := fmt.Sprintf("%s %s one-part prefill logits vs emulated one-part forward%s", kind, pr, tag)
			record(t, tag, "median max|d|/max|ref|", s1.quantile(0.5), max(medianBound, p1NoiseFactor*base1Med))
			record(t, tag, fmt.Sprintf("positions with err > %.0e", flipErr), s1.bigFrac(), max(flipFraction, base1Big))
			record(t, tag, "top-1 disagreeing", s1.disFrac(), max(flipFraction, base1Dis))
		})
	}
}

// noiseBaselineAt is noiseBaseline with every GEMV/GEMM output nudged by a
// relative level (0: noiseLevel).
func noiseBaselineAt(t *testing.T, src Source, toks []int, el, em [][]float32, level float64) flipStats {
	return noiseBaselineSeed(t, src, toks, el, em, level, 0)
}

// p1NoiseSeeds start the noisy emulator's nudge pattern (noisyEmu.n) of
// the one-part checks' baselines.
var p1NoiseSeeds = []uint64{0, 0x9e3779b97f4a7c15, 0xd1b54a32d192ed03}

// noiseBaselineSeed is noiseBaselineAt with the nudge pattern started at
// seed.
func noiseBaselineSeed(t *testing.T, src Source, toks []int, el, em [][]float32, level float64, seed uint64) flipStats {
	t.Helper()
	b, err := build(&noisyRunner{m: &noisyEmu{emuDevice: newEmu(), level: level, n: seed}}, src, engine.Options{MaxSeqLen: maxSeq})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	bl, bm, err := b.TeacherForce(0, toks)
	if err != nil {
		t.Fatal(err)
	}
	return compareRuns(el, em, bl, bm)
}

// pinModelledPrefill turns off, for one test, the opt-in prefill paths the
// emulated one-part forward does not transcribe (the tensor-core absorb, the
// sparse MLA prefill kernels other than mode 4): this test's GPU-vs-emulator
// bounds are float32-sized. On the H200 (docs/measured/h200-2026-12-02/run3)
// the gpu-check run with TILERT_GPU_ABSORB_TC=1 TILERT_GPU_MLA_PREFILL=2 in
// the environment moved deepseek-v3.2-tiny's one-part logits from the
// emulated ones past them (top-1 0.111 against a bound of 0.065) while the
// same test passed with only the GEMM switches set (run2).
//
// The MLA prefill is off here whatever its switch says (mode 4 included:
// this test checks the one-part GEMMs and absorbs; the combination with
// mla_prefill_h1 is TestGPUPrefillOnePartAll's, onepart_test.go), and the
// one-part absorbs on (TILERT_GPU_ABSORB_P1=0 in the environment must not
// make the GPU run what the emulator does not).
func pinModelledPrefill(t *testing.T) {
	oldTC, oldOn, oldMode, oldP1 := absorbTCOn, mlaPrefillOn, mlaPrefillMode, absorbP1On
	absorbTCOn, absorbP1On = false, true
	mlaPrefillOn, mlaPrefillMode = false, 0
	t.Cleanup(func() { absorbTCOn, mlaPrefillOn, mlaPrefillMode, absorbP1On = oldTC, oldOn, oldMode, oldP1 })
}
