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

	"github.com/cockroachdb/errors"
	"github.com/tilert-go/tilert/cuda"
)

//go:embed cu/*.cu cu/*.cuh
var kernelFS embed.FS

// KernelSource is the module NVRTC compiles: common.cuh, then every .cu in
// name order, each marked with #line so compile errors name the right file.
func KernelSource() string { return moduleSource(kernelFS, "cu/*.cu") }

// moduleSource is common.cuh, then every file of fsys matching glob in name
// order, each after a #line naming it.
func moduleSource(fsys embed.FS, glob string) string {
	var b strings.Builder
	common, err := kernelFS.ReadFile("cu/common.cuh")
	if err != nil {
		panic(err) // embedded at build time
	}
	b.WriteString("#line 1 \"common.cuh\"\n")
	b.Write(common)
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

// EarlyKernelSource is KernelSource compiled with TILERT_PDL_EARLY
// defined (TILERT_GPU_PDL=2; common.cuh, pdl.go): the same kernels, whose
// PDL macros expand to early triggers and pre-wait weight loads. A second
// module (its own cache entry); the default module is untouched.
func EarlyKernelSource() string { return "#define TILERT_PDL_EARLY 1\n" + KernelSource() }

// kernelOptions are the NVRTC flags for arch. No fast-math: the kernels are
// checked against float64 references at float32 bounds.
func kernelOptions(arch string) []string {
	return []string{"--gpu-architecture=" + arch, "--std=c++17", "-default-device", "-lineinfo"}
}

// Compile compiles the embedded kernels for a device of compute capability
// major.minor, through the cache. It needs NVRTC but no GPU.
func Compile(nv *cuda.NVRTC, major, minor int, cache cuda.KernelCache) (*cuda.Compiled, error) {
	return cuda.CompileModule(nv, major, minor, KernelSource(), "tilert_kernels.cu", kernelOptions, cache)
}

// CompileEarly compiles EarlyKernelSource as Compile does the default one.
func CompileEarly(nv *cuda.NVRTC, major, minor int, cache cuda.KernelCache) (*cuda.Compiled, error) {
	return cuda.CompileModule(nv, major, minor, EarlyKernelSource(), "tilert_kernels_early.cu", kernelOptions, cache)
}

// Set is the embedded kernels loaded in one context, with their typed
// launchers (ops.go, engine_ops.go).
type Set struct {
	c     *cuda.Ctx
	mod   *cuda.Module
	Build *cuda.Compiled
	pdl   bool // programmatic launches of pdlKernels (pdl.go)
	mode  int  // pdlMode this Set was loaded in: 2 = the TILERT_PDL_EARLY module
}

type setKey struct{}

type earlyKey struct{}

// Load compiles (or loads from the cache) and loads the embedded kernels in
// c on first use; later calls in the same context return the same Set.
// With TILERT_GPU_PDL=2 on a device that launches programmatically it is
// LoadEarly's Set.
func Load(c *cuda.Ctx) (*Set, error) {
	if pdlMode() == 2 && c.PDLSupported() {
		return LoadEarly(c)
	}
	v, err := c.Value(setKey{}, func() (any, error) {
		return loadSet(c, false, pdlEnv() && c.PDLSupported())
	})
	if err != nil {
		return nil, err
	}
	return v.(*Set), nil
}

// LoadEarly loads the TILERT_PDL_EARLY module (EarlyKernelSource) in c on
// first use, as a Set of its own that launches programmatically where the
// device can (PDL mode 2, whatever TILERT_GPU_PDL says; tests compare it
// with Load's Set in one context).
func LoadEarly(c *cuda.Ctx) (*Set, error) {
	v, err := c.Value(earlyKey{}, func() (any, error) {
		return loadSet(c, true, c.PDLSupported())
	})
	if err != nil {
		return nil, err
	}
	return v.(*Set), nil
}

func loadSet(c *cuda.Ctx, early, pdl bool) (*Set, error) {
	nv, err := cuda.LoadNVRTC()
	if err != nil {
		return nil, err
	}
	info := c.Info()
	compile, name, mode := Compile, "tilert_kernels", 0
	if pdl {
		mode = 1
	}
	if early {
		if !nv.CanCompileSM90a() {
			// NVRTC 11.8 dies with SIGSEGV compiling the early module (CI,
			// session 8): refuse before the crash.
			return nil, errors.WithHintf(errors.Newf("TILERT_GPU_PDL=2 needs NVRTC 12 or newer to build its module; this is NVRTC %s (%s)", nv.Version(), nv.Lib),
				"unset TILERT_GPU_PDL (or set it to 1), or point TILERT_NVRTC at a libnvrtc.so.12 or newer")
		}
		compile, name, mode = CompileEarly, "tilert_kernels_early", 2
	}
	ck, err := compile(nv, info.CCMajor, info.CCMinor, cuda.DefaultKernelCache())
	if err != nil {
		return nil, err
	}
	m, err := c.LoadModule(name, ck.Image)
	if err != nil {
		return nil, err
	}
	slog.Debug("cuda: kernels loaded", "module", name, "arch", ck.Arch, "cubin", ck.Cubin, "cache_hit", ck.CacheHit, "took", ck.Took, "nvrtc", nv.Version())
	return &Set{c: c, mod: m, Build: ck, pdl: pdl, mode: mode}, nil
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
