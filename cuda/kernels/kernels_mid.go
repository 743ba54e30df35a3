package kernels

import (
	"embed"

	"github.com/tilert-go/tilert/cuda"
)

// The mid module (TILERT_GPU_GEMV_MID=1): the gemv_mid_group kernels
// (cu/mid/gemv_mid.cu), compiled after common.cuh with the main module's
// flags for the device's own arch and loaded on first use, so the main
// module's source (and its kernel cache entry) stays main's. Its compile is
// small (~6 s with nvcc 11.8 here; the main module takes ~60 s).

//go:embed cu/mid/*.cu
var midFS embed.FS

// MidKernelSource is the mid module's source: common.cuh, gemv_tile.cuh
// (the grouped GEMV's pieces, the default module's text), then every
// cu/mid/*.cu in name order, each marked with #line.
func MidKernelSource() string { return moduleSource(midFS, "cu/mid/*.cu", gemvTileHeader) }

// CompileMid compiles the mid module for a device of compute capability
// major.minor through the cache (no GPU needed).
func CompileMid(nv *cuda.NVRTC, major, minor int, cache cuda.KernelCache) (*cuda.Compiled, error) {
	return cuda.CompileModule(nv, major, minor, MidKernelSource(), "tilert_kernels_mid.cu", kernelOptions, cache)
}

var midModule = &extraModule{
	name: "tilert_kernels_mid",
	compile: func(nv *cuda.NVRTC, i cuda.DeviceInfo) (*cuda.Compiled, error) {
		return CompileMid(nv, i.CCMajor, i.CCMinor, cuda.DefaultKernelCache())
	},
}

// mid loads the mid module in k's context on first use.
func (k *Set) mid() (*cuda.Module, error) { return midModule.load(k) }

// MidSupported says whether the mid module loads here, and if not why
// (the engine's runners ask before any graph capture).
func (k *Set) MidSupported() error {
	_, err := k.mid()
	return err
}
