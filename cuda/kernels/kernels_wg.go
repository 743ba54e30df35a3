package kernels

import (
	"embed"
	"log/slog"

	"github.com/cockroachdb/errors"

	"github.com/tilert-go/tilert/cuda"
)

// The sm_90a module: kernels on Hopper's arch-specific instructions
// (wgmma.mma_async), which plain sm_90 (and the PTX JIT of compute_90)
// does not have. Their sources live in cu/wg/ (outside the main module's
// cu/*.cu), are compiled after common.cuh with the main module's flags at
// --gpu-architecture=sm_90a, and are loaded on first use only: a device
// or NVRTC without sm_90a keeps the main module and loses these kernels
// alone (their launchers say so; the engine falls back).

//go:embed cu/wg/*.cu
var wgFS embed.FS

// WGKernelSource is the sm_90a module's source: common.cuh, then every
// cu/wg/*.cu in name order, each marked with #line.
func WGKernelSource() string { return moduleSource(wgFS, "cu/wg/*.cu") }

// CompileWG compiles the sm_90a module through the cache (NVRTC 12+, no
// GPU needed); cuda.ErrNoSM90a when nv cannot.
func CompileWG(nv *cuda.NVRTC, cache cuda.KernelCache) (*cuda.Compiled, error) {
	return cuda.CompileModuleSM90a(nv, WGKernelSource(), "tilert_kernels_wg.cu", kernelOptions, cache)
}

type wgKey struct{}

// wgState is the sm_90a module of a context, or why there is none (kept,
// so a failed compile is not retried on every launch).
type wgState struct {
	mod *cuda.Module
	err error
}

// wg loads the sm_90a module in k's context on first use.
func (k *Set) wg() (*cuda.Module, error) {
	v, _ := k.c.Value(wgKey{}, func() (any, error) {
		st := &wgState{}
		if i := k.c.Info(); i.CCMajor != 9 || i.CCMinor != 0 {
			st.err = errors.Newf("the sm_90a module needs a compute capability 9.0 device (this one is %d.%d)", i.CCMajor, i.CCMinor)
			return st, nil
		}
		nv, err := cuda.LoadNVRTC()
		if err != nil {
			st.err = err
			return st, nil
		}
		ck, err := CompileWG(nv, cuda.DefaultKernelCache())
		if err != nil {
			st.err = err
			return st, nil
		}
		st.mod, st.err = k.c.LoadModule("tilert_kernels_wg", ck.Image)
		slog.Debug("cuda: sm_90a kernels loaded", "arch", ck.Arch, "cache_hit", ck.CacheHit, "took", ck.Took, "nvrtc", nv.Version(), "err", st.err)
		return st, nil
	})
	st := v.(*wgState)
	return st.mod, st.err
}

// WGSupported says whether the sm_90a module loads here, and if not why.
func (k *Set) WGSupported() error {
	_, err := k.wg()
	return err
}
