package gpu

import (
	"embed"
	"io/fs"
	"log/slog"
	"sort"
	"strings"
	"time"

	"github.com/cockroachdb/errors"
)

//go:embed kernels/*.cu kernels/*.cuh
var kernelFS embed.FS

// KernelSource is the module NVRTC compiles: common.cuh, then every .cu in
// name order, each marked with #line so compile errors name the right file.
func KernelSource() string {
	var b strings.Builder
	common, err := kernelFS.ReadFile("kernels/common.cuh")
	if err != nil {
		panic(err) // embedded at build time
	}
	b.WriteString("#line 1 \"common.cuh\"\n")
	b.Write(common)
	names, err := fs.Glob(kernelFS, "kernels/*.cu")
	if err != nil {
		panic(err)
	}
	sort.Strings(names)
	for _, n := range names {
		src, err := kernelFS.ReadFile(n)
		if err != nil {
			panic(err)
		}
		b.WriteString("\n#line 1 \"" + strings.TrimPrefix(n, "kernels/") + "\"\n")
		b.Write(src)
	}
	return b.String()
}

// kernelOptions are the NVRTC flags for arch. No fast-math: the kernels are
// checked against float64 references at float32 bounds.
func kernelOptions(arch string) []string {
	return []string{"--gpu-architecture=" + arch, "--std=c++17", "-default-device", "-lineinfo"}
}

// CompiledKernels is the outcome of compiling the embedded module.
type CompiledKernels struct {
	Image    []byte
	Arch     string
	Cubin    bool
	CacheHit bool
	Key      string
	Took     time.Duration
}

// CompileKernels compiles the embedded kernels for a device of compute
// capability major.minor, through the cache. It needs NVRTC but no GPU.
func CompileKernels(nv *NVRTC, major, minor int, cache KernelCache) (*CompiledKernels, error) {
	arch, cubin, err := chooseArch(major, minor, nv.SupportedArchs(), nv.Major, nv.cubinSize != 0)
	if err != nil {
		return nil, err
	}
	src := KernelSource()
	opts := kernelOptions(arch)
	key := CacheKey(src, opts, arch, nv.Version())
	ext := "ptx"
	if cubin {
		ext = "cubin"
	}
	start := time.Now()
	if img, ok := cache.Load(key, ext); ok {
		return &CompiledKernels{Image: img, Arch: arch, Cubin: cubin, CacheHit: true, Key: key, Took: time.Since(start)}, nil
	}
	img, err := nv.Compile(src, "tilert_kernels.cu", opts, cubin)
	if err != nil {
		return nil, errors.Wrapf(err, "compiling the embedded kernels for %s with NVRTC %s (%s)", arch, nv.Version(), nv.Lib)
	}
	if err := cache.Store(key, ext, img); err != nil {
		slog.Warn("gpu: kernel cache not written", "err", err)
	}
	return &CompiledKernels{Image: img, Arch: arch, Cubin: cubin, Key: key, Took: time.Since(start)}, nil
}

// Kernels holds the loaded kernel module of a context.
type Kernels struct {
	c     *Ctx
	mod   *Module
	Build *CompiledKernels
}

// Kernels compiles (or loads from the cache) and loads the embedded kernels
// on first use.
func (c *Ctx) Kernels() (*Kernels, error) {
	if c.kern != nil {
		return c.kern, nil
	}
	nv, err := LoadNVRTC()
	if err != nil {
		return nil, err
	}
	ck, err := CompileKernels(nv, c.dev.Info.CCMajor, c.dev.Info.CCMinor, DefaultKernelCache())
	if err != nil {
		return nil, err
	}
	m, err := c.LoadModule("tilert_kernels", ck.Image)
	if err != nil {
		return nil, err
	}
	slog.Debug("gpu: kernels loaded", "arch", ck.Arch, "cubin", ck.Cubin, "cache_hit", ck.CacheHit, "took", ck.Took, "nvrtc", nv.Version())
	c.kern = &Kernels{c: c, mod: m, Build: ck}
	return c.kern, nil
}

// fn returns a kernel of the module.
func (k *Kernels) fn(name string) (*Function, error) { return k.c.Function(k.mod, name) }

func (k *Kernels) launch(name string, grid, block Dim3, smem int, s Stream, args ...any) error {
	f, err := k.fn(name)
	if err != nil {
		return err
	}
	return k.c.Launch(f, grid, block, smem, s, args...)
}
