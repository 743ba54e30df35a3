package kernels

import (
	"embed"

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

// wgModule: the sm_90a module needs a compute capability 9.0 device.
var wgModule = &extraModule{
	name: "tilert_kernels_wg",
	need: func(i cuda.DeviceInfo) error {
		if i.CCMajor != 9 || i.CCMinor != 0 {
			return errors.Newf("the sm_90a module needs a compute capability 9.0 device (this one is %d.%d)", i.CCMajor, i.CCMinor)
		}
		return nil
	},
	compile: func(nv *cuda.NVRTC, _ cuda.DeviceInfo) (*cuda.Compiled, error) {
		return CompileWG(nv, cuda.DefaultKernelCache())
	},
}

// wg loads the sm_90a module in k's context on first use.
func (k *Set) wg() (*cuda.Module, error) { return wgModule.load(k) }

// WGSupported says whether the sm_90a module loads here, and if not why.
func (k *Set) WGSupported() error {
	_, err := k.wg()
	return err
}
