package kernels

import (
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/cockroachdb/errors"

	"github.com/tilert-go/tilert/cuda"
	"github.com/tilert-go/tilert/numeric"
)

func TestKernelSourceHasLaunchedKernels(t *testing.T) {
	src := KernelSource()
	defs := map[string]bool{}
	for _, m := range regexp.MustCompile(`extern "C" __global__ void(?: __launch_bounds__\(\d+\))? (\w+)\(`).FindAllStringSubmatch(src, -1) {
		defs[m[1]] = true
	}
	for _, m := range regexp.MustCompile(`(?m)^GEMV_KERNELS\((\w+),`).FindAllStringSubmatch(src, -1) {
		defs[m[1]] = true
	}
	ops, err := os.ReadFile("ops.go")
	if err != nil {
		t.Fatal(err)
	}
	uses := regexp.MustCompile(`k\.launch\("(\w+)"`).FindAllStringSubmatch(string(ops), -1)
	if len(uses) < 14 {
		t.Fatalf("only %d launches found in ops.go", len(uses))
	}
	for _, u := range uses {
		if !defs[u[1]] {
			t.Errorf("ops.go launches %s, not defined in the kernels (have %v)", u[1], defs)
		}
	}
	for base, rs := range gemvKernels {
		for _, r := range rs {
			if name := fmt.Sprintf("%s_r%d", base, r); !defs[name] {
				t.Errorf("GEMV variant %s not defined in the kernels", name)
			}
		}
	}
	// The wide GEMVs' launchers pick rows per block from 1, 2, 4, 8.
	wide := map[string]bool{}
	for _, m := range regexp.MustCompile(`extern "C" __global__ void __launch_bounds__\(256, 4\)\s+(\w+_wide_r\d)\(`).FindAllStringSubmatch(src, -1) {
		wide[m[1]] = true
	}
	for _, base := range []string{"gemv_fp8_wide", "gemv_bf16_wide", "gemv_fp8_experts_wide"} {
		for _, r := range []int{1, 2, 4, 8} {
			if name := fmt.Sprintf("%s_r%d", base, r); !wide[name] {
				t.Errorf("wide GEMV variant %s not defined in the kernels", name)
			}
		}
	}
}

// With NVRTC present (no GPU needed) the embedded kernels must compile.
func TestNVRTCCompilesKernels(t *testing.T) {
	nv, err := cuda.LoadNVRTC()
	if err != nil {
		t.Skipf("no NVRTC here, compile check skipped: %v", err)
	}
	t.Logf("NVRTC %s from %s, archs %v", nv.Version(), nv.Lib, nv.SupportedArchs())
	dir := t.TempDir()
	ck, err := Compile(nv, 9, 0, cuda.KernelCache{Dir: dir})
	if err != nil {
		t.Fatalf("%+v", err)
	}
	if len(ck.Image) < 1000 || ck.CacheHit {
		t.Fatalf("image %d bytes, hit %v", len(ck.Image), ck.CacheHit)
	}
	t.Logf("compiled for %s (cubin %v) in %v, %d bytes, options %q", ck.Arch, ck.Cubin, ck.Took, len(ck.Image), ck.Options)
	again, err := Compile(nv, 9, 0, cuda.KernelCache{Dir: dir})
	if err != nil || !again.CacheHit || string(again.Image) != string(ck.Image) {
		t.Fatalf("second compile not served from the cache: %v", err)
	}
	// Parallel compilation asked for: an NVRTC that refuses the flag
	// compiles on one thread instead (NVRTC 11.8 here), a newer one uses it.
	t.Setenv("TILERT_NVRTC_THREADS", "2")
	par, err := Compile(nv, 9, 0, cuda.KernelCache{Dir: t.TempDir()})
	if err != nil {
		t.Fatalf("with TILERT_NVRTC_THREADS=2: %+v", err)
	}
	t.Logf("TILERT_NVRTC_THREADS=2: %v, options %q", par.Took, par.Options)
	// A compile error must come back with NVRTC's log.
	// (at the oldest arch this NVRTC knows: NVRTC 13 dropped everything below 75).
	low := 75
	if a := nv.SupportedArchs(); len(a) > 0 {
		low = slices.Min(a)
	}
	_, err = nv.Compile("extern \"C\" __global__ void k() { undefined_thing(); }", "bad.cu", []string{fmt.Sprintf("--gpu-architecture=compute_%d", low)}, false)
	if err == nil || !strings.Contains(errors.FlattenDetails(err), "undefined_thing") {
		t.Errorf("compile error without log: %+v", err)
	}
}

func TestReferencesAgreeWithNumeric(t *testing.T) {
	for b := range 256 {
		got, want := fp8Table[b], float64(numeric.FP8E4M3ToFloat32(byte(b)))
		if got != want && !(math.IsNaN(got) && math.IsNaN(want)) {
			t.Errorf("fp8 code %#x: %v vs numeric %v", b, got, want)
		}
	}
	r := rand.New(rand.NewPCG(1, 2))
	for i := range 20000 {
		f := float32(r.NormFloat64() * math.Ldexp(1, r.IntN(24)-14))
		if i%7 == 0 { // exact midpoints between codes
			c := byte(r.IntN(0x7e))
			f = float32((fp8Table[c] + fp8Table[c+1]) / 2)
		}
		if got, want := fp8Encode(f), numeric.Float32ToFP8E4M3(f); got != want {
			t.Fatalf("fp8 encode %g: %#x vs numeric %#x", f, got, want)
		}
		if got, want := bf16Round(f), numeric.Float32ToBF16(f); got != want {
			t.Fatalf("bf16 round %g: %#x vs numeric %#x", f, got, want)
		}
	}
	for _, amax := range []float32{0, 1, 448, 448 * 3, 1e-9, 3.3} {
		if got, want := refUE8M0(amax), numeric.UE8M0Scale(amax); got != want {
			t.Errorf("ue8m0(%g) = %g, numeric %g", amax, got, want)
		}
	}
	// The device RNG's output must stay inside (0,1).
	for i := range uint64(100000) {
		if u := rngUniform(7, 3, i); !(u > 0 && u < 1) {
			t.Fatalf("uniform %v out of (0,1)", u)
		}
	}
}

// refSampleSet: top-k keeps exactly the k largest (no ties here), top-p the
// shortest prefix reaching the mass, min_p the tokens at least that share of
// the mode's probability.
func TestRefSampleSet(t *testing.T) {
	x := []float32{0, 1, 2, 3}
	p := refSampleSet(x, 1, 2, 1, 0)
	if p[0] != 0 || p[1] != 0 || math.Abs(p[2]+p[3]-1) > 1e-12 || p[3] <= p[2] {
		t.Errorf("top-k 2: %v", p)
	}
	p = refSampleSet(x, 1, 0, 0.5, 0)
	if p[3] != 1 {
		t.Errorf("top-p 0.5 should keep only the mode (p=0.64): %v", p)
	}
	p = refSampleSet(x, 1, 0, 0.7, 0)
	if p[3] == 0 || p[2] == 0 || p[1] != 0 {
		t.Errorf("top-p 0.7: %v", p)
	}
	// min_p 0.3: e^-1 = 0.37 of the mode's probability stays, e^-2 = 0.14 goes.
	p = refSampleSet(x, 1, 0, 1, 0.3)
	if p[3] == 0 || p[2] == 0 || p[1] != 0 || p[0] != 0 || math.Abs(p[2]+p[3]-1) > 1e-12 {
		t.Errorf("min_p 0.3: %v", p)
	}
	// with top-p 0.7 after it: the mass is of the min_p survivors (0.73, 0.27).
	p = refSampleSet(x, 1, 0, 0.7, 0.3)
	if p[3] != 1 {
		t.Errorf("min_p 0.3 + top-p 0.7: %v", p)
	}
}

// Go transcriptions of the bit tricks in kernels/common.cuh, checked
// exhaustively here so a device mismatch points at the device.
func devFP8ToF32(b uint32) float32 {
	s := (b & 0x80) << 24
	a := b & 0x7f
	var r float32
	if a >= 8 {
		if a == 0x7f {
			return math.Float32frombits(0x7fc00000 | s)
		}
		r = math.Float32frombits((a << 20) + (120 << 23))
	} else {
		r = float32(a) * 0.001953125
	}
	return math.Float32frombits(math.Float32bits(r) | s)
}

func devF32ToFP8(f float32) byte {
	u := math.Float32bits(f)
	s := (u >> 24) & 0x80
	if f != f {
		return 0x7f
	}
	a := float32(math.Abs(float64(f)))
	if a >= 448 {
		return byte(s | 0x7e)
	}
	if a < 0.015625 {
		return byte(s | uint32(math.RoundToEven(float64(a*512))))
	}
	au := math.Float32bits(a)
	au += 0x7ffff + ((au >> 20) & 1)
	r := (((au >> 23) - 120) << 3) | ((au >> 20) & 7)
	if r > 0x7e {
		r = 0x7e
	}
	return byte(s | r)
}

func TestDeviceConversionTranscriptions(t *testing.T) {
	for b := range uint32(256) {
		got, want := float64(devFP8ToF32(b)), fp8Table[b]
		if got != want && !(math.IsNaN(got) && math.IsNaN(want)) {
			t.Errorf("fp8 decode %#x: %v want %v", b, got, want)
		}
	}
	r := rand.New(rand.NewPCG(3, 4))
	for i := range 200000 {
		f := float32(r.NormFloat64() * math.Ldexp(1, r.IntN(30)-18))
		if i%5 == 0 {
			c := byte(r.IntN(0x7e))
			f = float32((fp8Table[c] + fp8Table[c+1]) / 2)
			if i%10 == 0 {
				f = -f
			}
		}
		if got, want := devF32ToFP8(f), fp8Encode(f); got != want {
			t.Fatalf("fp8 encode %g: device rule %#x, reference %#x", f, got, want)
		}
	}
}

// topk_radix_mark_l reads its candidate list as uint2: the list must be
// 8-byte aligned in the scratch for every row count and length.
func TestTopKRadixLayoutAligned(t *testing.T) {
	for rows := 1; rows <= 9; rows++ {
		for _, T := range []int{1, 31, 33, 2049, 8192, 131072, 163840} {
			l, total := topkRadixLayout(rows, T)
			if l.list%16 != 0 || int64(l.list+rows*T*8) != total || l.list < l.ccnt+rows*4 || l.ccnt < l.l2+rows*1024*4 {
				t.Fatalf("rows=%d T=%d: layout %+v total %d", rows, T, l, total)
			}
		}
	}
}

// mlaCombineFor: the early-load combine while its blocks fit one wave of 3
// per SM, the 64-register one past that.
func TestMLACombineFor(t *testing.T) {
	for _, c := range []struct {
		sms, blocks int
		want        string
	}{{132, 128, "mla_combine_wide"}, {132, 16, "mla_combine_wide"}, {132, 396, "mla_combine_wide"},
		{132, 512, "mla_combine_wide_v1"}, {0, 4, "mla_combine_wide_v1"}} {
		if got := mlaCombineFor(c.sms, c.blocks); got != c.want {
			t.Errorf("mlaCombineFor(%d, %d) = %s, want %s", c.sms, c.blocks, got, c.want)
		}
	}
}

// SampleScratchBytes must be the kernels' SW_ROW_BYTES a row: a smaller
// scratch would have the last row's histogram run past it.
func TestSampleWideScratchMatchesSource(t *testing.T) {
	src := KernelSource()
	def := func(name string) int {
		m := regexp.MustCompile(`#define ` + name + ` (\d+)`).FindStringSubmatch(src)
		if m == nil {
			t.Fatalf("no #define %s in the kernels", name)
		}
		var v int
		fmt.Sscan(m[1], &v)
		return v
	}
	bins, maxb := def("SW_BINS"), def("SW_MAXB")
	if want := 8 + 64 + bins*8 + maxb*8; SampleScratchBytes(1) != int64(want) || maxb != sampleWideBlocks {
		t.Errorf("SampleScratchBytes(1) = %d, blocks %d; the kernels' row is %d bytes, %d blocks", SampleScratchBytes(1), sampleWideBlocks, want, maxb)
	}
}

// EvictFirst (the default) and its absence both compile, and only the
// default's PTX holds the evict-first policy and cache-hinted loads: the
// weight loads of the tile, row and wide GEMVs and the absorb module (the
// whole modules compile in TestNVRTCCompilesKernels and the module tests;
// the indexer keys' loads are in the sm_90a module, TestNVRTCCompilesWGModule).
func TestNVRTCCompilesEvictFirst(t *testing.T) {
	nv, err := cuda.LoadNVRTC()
	if err != nil {
		t.Skipf("no NVRTC here, compile check skipped: %v", err)
	}
	if !EvictFirst || !GroupNormal {
		t.Fatalf("EvictFirst %v, GroupNormal %v by default, want both on", EvictFirst, GroupNormal)
	}
	defer func() { EvictFirst, GroupNormal = true, true }()
	GroupNormal = false // every module's weight loads hinted first; GroupNormal below
	for _, part := range []struct {
		name, glob string
		headers    []string
	}{
		{"gemv_tile.cu", "cu/gemv_tile.cu", []string{gemvTileHeader}},
		{"gemv_tile_group.cu", "cu/gemv_tile_group.cu", []string{gemvTileHeader}},
		{"gemv_wide.cu", "cu/gemv_wide.cu", []string{"cu/gemv.cu"}}, // gemv.cu's formats and row GEMVs, then the wide ones
		{"absorb_fast.cu", "cu/absorb/absorb_fast.cu", []string{mlaAbsorbHeader}},
	} {
		fsys := kernelFS
		if strings.HasPrefix(part.glob, "cu/absorb/") {
			fsys = absorbFS
		}
		src := moduleSource(fsys, part.glob, part.headers...)
		if !strings.Contains(src, "extern \"C\" __global__") {
			t.Fatalf("%s: no kernels in the source (the wrong embedded FS?)", part.name)
		}
		for _, on := range []bool{true, false} {
			EvictFirst = on
			opts := kernelOptions("compute_90")
			if slices.Contains(opts, "-DTILERT_L2_EVICT_FIRST") != on {
				t.Fatalf("EvictFirst %v: options %q", on, opts)
			}
			ptx, err := nv.Compile(src, part.name, opts, false)
			if err != nil {
				t.Fatalf("%s, EvictFirst %v: %+v", part.name, on, err)
			}
			hinted := strings.Contains(string(ptx), "createpolicy.fractional.L2::evict_first") && strings.Contains(string(ptx), "L2::cache_hint")
			if hinted != on {
				t.Errorf("%s, EvictFirst %v: evict-first policy and cache-hinted loads in the PTX: %v", part.name, on, hinted)
			}
		}
	}
	// GroupNormal: the grouped GEMVs (group_load, their only weight loads)
	// without the hints.
	EvictFirst, GroupNormal = true, true
	for _, c := range []struct {
		glob   string
		hinted bool
	}{{"cu/gemv_tile_group.cu", false}} {
		ptx, err := nv.Compile(moduleSource(kernelFS, c.glob, gemvTileHeader), "g.cu", kernelOptions("compute_90"), false)
		if err != nil {
			t.Fatalf("%s with GroupNormal: %+v", c.glob, err)
		}
		if got := strings.Contains(string(ptx), "L2::cache_hint"); got != c.hinted {
			t.Errorf("%s with GroupNormal: cache-hinted loads %v, want %v", c.glob, got, c.hinted)
		}
	}
}
