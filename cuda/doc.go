// Package cuda drives NVIDIA GPUs through the CUDA driver API and NVRTC without cgo.
//
// Both libraries are opened at run time with purego, so a CGO_ENABLED=0 binary
// runs on machines without a GPU (it just reports that none is there). All CUDA
// work for one device runs on a single goroutine locked to its OS thread,
// because a CUDA context is current per thread: callers submit closures with
// (*Device).Do and get a *Ctx that is only valid inside the closure.
//
// This package knows no model: CompileModule compiles any CUDA C source for the
// device's architecture through an on-disk cache (KernelCache); the model's
// kernels and their launchers are package cuda/kernels.
package cuda
