package cuda

import (
	"log/slog"
	"os"
	"slices"
	"strconv"
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
	// Options are the NVRTC flags the image was built with.
	Options []string
}

// CompileModule compiles src (named name in messages) with NVRTC for a
// device of compute capability major.minor, with the flags options gives
// for the chosen architecture, through the cache. It needs NVRTC but no GPU.
func CompileModule(nv *NVRTC, major, minor int, src, name string, options func(arch string) []string, cache KernelCache) (*Compiled, error) {
	arch, cubin, err := chooseArch(major, minor, nv.SupportedArchs(), nv.Major, nv.cubinSize != 0)
	if err != nil {
		return nil, err
	}
	return compileModule(nv, arch, cubin, src, name, options, cache)
}

// ErrNoSM90a: this NVRTC cannot build for sm_90a (Hopper's arch-specific
// target, which wgmma and setmaxnreg need): NVRTC 12.0 or newer can.
var ErrNoSM90a = errors.New("this NVRTC cannot compile for sm_90a")

// CanCompileSM90a says whether nv builds sm_90a images (NVRTC 12+ that
// lists sm_90, with cubin output).
func (n *NVRTC) CanCompileSM90a() bool {
	return n.Major >= 12 && n.cubinSize != 0 && slices.Contains(n.archs, 90)
}

// CompileModuleSM90a compiles src for sm_90a (a cubin) whatever arch
// CompileModule would pick: a module of kernels that need Hopper's
// arch-specific instructions, beside the main module. It fails with
// ErrNoSM90a when nv cannot build for sm_90a.
func CompileModuleSM90a(nv *NVRTC, src, name string, options func(arch string) []string, cache KernelCache) (*Compiled, error) {
	if !nv.CanCompileSM90a() {
		return nil, errors.WithHintf(errors.Wrapf(ErrNoSM90a, "NVRTC %s (%s), archs %v", nv.Version(), nv.Lib, nv.SupportedArchs()),
			"set TILERT_NVRTC to a libnvrtc.so of CUDA 12 or newer")
	}
	return compileModule(nv, "sm_90a", true, src, name, options, cache)
}

func compileModule(nv *NVRTC, arch string, cubin bool, src, name string, options func(arch string) []string, cache KernelCache) (*Compiled, error) {
	split, err := splitCompileOption(nv.Major, nv.Minor, os.Getenv(envNVRTCThreads))
	if err != nil {
		return nil, err
	}
	ext := "ptx"
	if cubin {
		ext = "cubin"
	}
	start := time.Now()
	base := options(arch)
	tries := [][]string{base}
	if split != "" {
		// An NVRTC that refuses the option compiles without it.
		tries = [][]string{append(slices.Clone(base), split), base}
	}
	for i, opts := range tries {
		key := CacheKey(src, opts, arch, nv.Version())
		if img, ok := cache.Load(key, ext); ok {
			return &Compiled{Image: img, Arch: arch, Cubin: cubin, CacheHit: true, Key: key, Took: time.Since(start), Options: opts}, nil
		}
		img, err := nv.Compile(src, name, opts, cubin)
		if err != nil {
			if i+1 < len(tries) && errors.Is(err, ErrNVRTCInvalidOption) {
				slog.Info("cuda: NVRTC refused parallel compilation; compiling on one thread", "option", split, "nvrtc", nv.Version())
				continue
			}
			return nil, errors.Wrapf(err, "compiling %s for %s with NVRTC %s (%s)", name, arch, nv.Version(), nv.Lib)
		}
		if err := cache.Store(key, ext, img); err != nil {
			slog.Warn("cuda: kernel cache not written", "err", err)
		}
		return &Compiled{Image: img, Arch: arch, Cubin: cubin, Key: key, Took: time.Since(start), Options: opts}, nil
	}
	return nil, errors.AssertionFailedf("no compile attempt") // unreachable: tries is never empty
}

// envNVRTCThreads caps the threads NVRTC optimises the kernels on (its
// --split-compile): unset or 0 for every core, 1 for one thread.
const envNVRTCThreads = "TILERT_NVRTC_THREADS"

// splitCompileOption is the NVRTC flag that runs the module's optimisation
// passes on several threads (NVRTC 12.1+): the embedded module is ~100
// kernels, most of them template instances, and on one thread its first
// compile on a fresh machine takes ~45 s.
func splitCompileOption(major, minor int, env string) (string, error) {
	if env == "" {
		if major < 12 || major == 12 && minor < 1 {
			return "", nil
		}
		return "--split-compile=0", nil
	}
	n, err := strconv.Atoi(env)
	if err != nil || n < 0 {
		return "", errors.WithHintf(errors.Newf("%s=%q is not a thread count", envNVRTCThreads, env),
			"set it to 0 (every core), 1 (one thread) or another positive count, or unset it")
	}
	if n == 1 {
		return "", nil
	}
	return "--split-compile=" + env, nil // asked for: tried even on an older NVRTC
}
