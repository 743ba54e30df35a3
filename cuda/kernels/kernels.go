// Package kernels holds the decode model's CUDA C kernels (cu/*.cu: GEMVs, norms,
// RoPE, the MoE router, the DSA indexer, MLA decode over vLLM's cache layouts,
// sampling, cache writes), embedded and compiled by NVRTC through package cuda,
// and their typed launchers, which check shapes so a bad call fails with a
// message instead of a device fault. Each kernel has a check against its CPU
// reference on fresh random inputs (make gpu-check).
package kernels

import (
	"embed"
	"io/fs"
	"log/slog"
	"sort"
	"strings"

	"github.com/tilert-go/tilert/cuda"
)

//go:embed cu/*.cu cu/*.cuh
var kernelFS embed.FS

// KernelSource is the module NVRTC compiles: common.cuh, the headers it
// shares with the modules beside it (defaultHeaders), then every .cu in
// name order, each marked with #line so compile errors name the right file.
func KernelSource() string { return moduleSource(kernelFS, "cu/*.cu", defaultHeaders...) }

// Headers of cu/ holding device code that the default module and a module
// beside it both run (one text, so the extra module's kernels keep the
// default ones' bits without a transcribed copy): the default module takes
// them all; an extra module names those it needs after common.cuh. Each
// needs only common.cuh.
const (
	gemvTileHeader  = "cu/gemv_tile.cuh"  // tile / grouped GEMV pieces (mid)
	mlaAbsorbHeader = "cu/mla_absorb.cuh" // absorb products' loads and sums (absorb)
	topkRadixHeader = "cu/topk_radix.cuh" // top-k keys, digits and emit (few)
)

var defaultHeaders = []string{gemvTileHeader, mlaAbsorbHeader, topkRadixHeader}

// moduleSource is common.cuh, then headers (cu/ files, in the order given),
// then every file of fsys matching glob in name order, each after a #line
// naming it.
func moduleSource(fsys embed.FS, glob string, headers ...string) string {
	var b strings.Builder
	for i, h := range append([]string{"cu/common.cuh"}, headers...) {
		src, err := kernelFS.ReadFile(h)
		if err != nil {
			panic(err) // embedded at build time
		}
		if i > 0 {
			b.WriteString("\n")
		}
		b.WriteString("#line 1 \"" + strings.TrimPrefix(h, "cu/") + "\"\n")
		b.Write(src)
	}
	names, err := fs.Glob(fsys, glob)
	if err != nil {
		panic(err)
	}
	sort.Strings(names)
	for _, n := range names {
		src, err := fsys.ReadFile(n)
		if err != nil {
			panic(err)
		}
		b.WriteString("\n#line 1 \"" + strings.TrimPrefix(n, "cu/") + "\"\n")
		b.Write(src)
	}
	return b.String()
}

// kernelOptions are the NVRTC flags for arch. No fast-math: the kernels are
// checked against float64 references at float32 bounds.
func kernelOptions(arch string) []string {
	o := []string{"--gpu-architecture=" + arch, "--std=c++17", "-default-device", "-lineinfo"}
	if EvictFirst {
		o = append(o, "-DTILERT_L2_EVICT_FIRST")
		if GroupNormal {
			o = append(o, "-DTILERT_L2_GROUP_NORMAL")
		}
	}
	if BlockClocks {
		o = append(o, "-DTILERT_BLOCK_CLOCKS")
	}
	return o
}

// EvictFirst compiles every module with TILERT_L2_EVICT_FIRST (common.cuh):
// the weight streams' and the indexer keys' loads marked evict-first in the
// L2, the same arithmetic, so the same bits. The engine clears it before
// its first Load with TILERT_GPU_L2_EVICT=normal; the options are part of
// the kernel cache's key. Session 47 (one H100, 9 MoE layers, A/B/A/B
// against normal, docs/measured/h100-2026-12-06-s47 calls C-E): 1 slot
// DeepSeek-V3.2 dims -38 / -35 us a step at 8192, -28 / -24 at 131072,
// GLM-5 dims -14 / -16 at 8192, -32 / -29 at 131072; 4 slots -4 / -13 and
// GLM-5 131072 -38 / -29; MTP -2 / -2. The weights alone (the keys' loads
// as before) lost at 131072 (GLM-5 dims +14..+19 us).
var EvictFirst = true

// GroupNormal (with EvictFirst) keeps the grouped GEMVs' weight loads (the
// attention inputs at a layer's start) at normal priority: session 47's
// traced step had that launch ~1.2 us a layer slower with EvictFirst while
// the long streams gained. Session 48 (one H100, 9 MoE layers, A/B/A/B
// against GroupNormal off, docs/measured/h100-2026-12-06-s48): 1 slot
// DeepSeek-V3.2 dims -11 / -14 us a step at 8192, -13 / -11 at 131072,
// GLM-5 dims -27 / -26 at 8192, -33 / -32 at 131072. The engine clears it
// with TILERT_GPU_L2_EVICT=keys.
var GroupNormal = true

// Compile compiles the embedded kernels for a device of compute capability
// major.minor, through the cache. It needs NVRTC but no GPU.
func Compile(nv *cuda.NVRTC, major, minor int, cache cuda.KernelCache) (*cuda.Compiled, error) {
	return cuda.CompileModule(nv, major, minor, KernelSource(), "tilert_kernels.cu", kernelOptions, cache)
}

// Set is the embedded kernels loaded in one context, with their typed
// launchers (ops.go, engine_ops.go).
type Set struct {
	c     *cuda.Ctx
	mod   *cuda.Module
	Build *cuda.Compiled
	pdl   bool // programmatic launches of pdlKernels (pdl.go)
	plain bool // SetPlain: every launch plain for now
	// edgeNext: SetEdgeNext's request for the next waiting launch
	edgeNext bool
	prio     int // SetPriority: every launch's scheduling priority for now (0: the stream's)
	// tileB caps the tile GEMVs' grids at tileB blocks per SM (SetTileCap;
	// 0: a block per row tile).
	tileB int
	// plans pins one-row tile GEMVs' launches by shape (SetTilePlan).
	plans map[[2]int]TilePlan
	// stageErr: what stageSetup met when a shape was pinned to the staged
	// GEMV (its launches return it).
	stageErr error
}

type setKey struct{}

// Load compiles (or loads from the cache) and loads the embedded kernels in
// c on first use; later calls in the same context return the same Set.
func Load(c *cuda.Ctx) (*Set, error) {
	pdl, err := pdlEnv()
	if err != nil {
		return nil, err
	}
	v, err := c.Value(setKey{}, func() (any, error) {
		nv, err := cuda.LoadNVRTC()
		if err != nil {
			return nil, err
		}
		if err := clocksNeed(nv); err != nil {
			return nil, err
		}
		info := c.Info()
		ck, err := Compile(nv, info.CCMajor, info.CCMinor, cuda.DefaultKernelCache())
		if err != nil {
			return nil, err
		}
		m, err := c.LoadModule("tilert_kernels", ck.Image)
		if err != nil {
			return nil, err
		}
		slog.Debug("cuda: kernels loaded", "arch", ck.Arch, "cubin", ck.Cubin, "cache_hit", ck.CacheHit, "took", ck.Took, "nvrtc", nv.Version())
		return &Set{c: c, mod: m, Build: ck, pdl: pdl && c.PDLSupported()}, nil
	})
	if err != nil {
		return nil, err
	}
	return v.(*Set), nil
}

// fn returns a kernel of the module.
func (k *Set) fn(name string) (*cuda.Function, error) { return k.c.Function(k.mod, name) }

func (k *Set) launch(name string, grid, block cuda.Dim3, smem int, s cuda.Stream, args ...any) error {
	f, err := k.fn(name)
	if err != nil {
		return err
	}
	return k.launchFn(f, grid, block, smem, s, args...)
}
