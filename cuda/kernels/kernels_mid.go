package kernels

import (
	"embed"
	"log/slog"

	"github.com/tilert-go/tilert/cuda"
)

// The mid module (TILERT_GPU_GEMV_MID=1): the gemv_mid_group kernels
// (cu/mid/gemv_mid.cu), compiled after common.cuh with the main module's
// flags for the device's own arch and loaded on first use, so the main
// module's source (and its kernel cache entry) stays main's. Its compile is
// small (~6 s with nvcc 11.8 here; the main module takes ~60 s).

//go:embed cu/mid/*.cu
var midFS embed.FS

// MidKernelSource is the mid module's source: common.cuh, then every
// cu/mid/*.cu in name order, each marked with #line.
func MidKernelSource() string { return moduleSource(midFS, "cu/mid/*.cu") }

// CompileMid compiles the mid module for a device of compute capability
// major.minor through the cache (no GPU needed).
func CompileMid(nv *cuda.NVRTC, major, minor int, cache cuda.KernelCache) (*cuda.Compiled, error) {
	return cuda.CompileModule(nv, major, minor, MidKernelSource(), "tilert_kernels_mid.cu", kernelOptions, cache)
}

type midKey struct{}

// midState is the mid module of a context, or why there is none (kept, so
// a failed compile is not retried on every launch).
type midState struct {
	mod *cuda.Module
	err error
}

// mid loads the mid module in k's context on first use.
func (k *Set) mid() (*cuda.Module, error) {
	v, _ := k.c.Value(midKey{}, func() (any, error) {
		st := &midState{}
		nv, err := cuda.LoadNVRTC()
		if err != nil {
			st.err = err
			return st, nil
		}
		i := k.c.Info()
		ck, err := CompileMid(nv, i.CCMajor, i.CCMinor, cuda.DefaultKernelCache())
		if err != nil {
			st.err = err
			return st, nil
		}
		st.mod, st.err = k.c.LoadModule("tilert_kernels_mid", ck.Image)
		slog.Debug("cuda: mid kernels loaded", "arch", ck.Arch, "cache_hit", ck.CacheHit, "took", ck.Took, "nvrtc", nv.Version(), "err", st.err)
		return st, nil
	})
	st := v.(*midState)
	return st.mod, st.err
}

// MidSupported says whether the mid module loads here, and if not why
// (the engine's runners ask before any graph capture).
func (k *Set) MidSupported() error {
	_, err := k.mid()
	return err
}
