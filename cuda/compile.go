package cuda

import (
	"log/slog"
	"time"

	"github.com/cockroachdb/errors"
)

// Compiled is the outcome of compiling a CUDA C module.
type Compiled struct {
	Image    []byte
	Arch     string
	Cubin    bool
	CacheHit bool
	Key      string
	Took     time.Duration
}

// CompileModule compiles src (named name in messages) with NVRTC for a
// device of compute capability major.minor, with the flags options gives
// for the chosen architecture, through the cache. It needs NVRTC but no GPU.
func CompileModule(nv *NVRTC, major, minor int, src, name string, options func(arch string) []string, cache KernelCache) (*Compiled, error) {
	arch, cubin, err := chooseArch(major, minor, nv.SupportedArchs(), nv.Major, nv.cubinSize != 0)
	if err != nil {
		return nil, err
	}
	opts := options(arch)
	key := CacheKey(src, opts, arch, nv.Version())
	ext := "ptx"
	if cubin {
		ext = "cubin"
	}
	start := time.Now()
	if img, ok := cache.Load(key, ext); ok {
		return &Compiled{Image: img, Arch: arch, Cubin: cubin, CacheHit: true, Key: key, Took: time.Since(start)}, nil
	}
	img, err := nv.Compile(src, name, opts, cubin)
	if err != nil {
		return nil, errors.Wrapf(err, "compiling %s for %s with NVRTC %s (%s)", name, arch, nv.Version(), nv.Lib)
	}
	if err := cache.Store(key, ext, img); err != nil {
		slog.Warn("cuda: kernel cache not written", "err", err)
	}
	return &Compiled{Image: img, Arch: arch, Cubin: cubin, Key: key, Took: time.Since(start)}, nil
}
