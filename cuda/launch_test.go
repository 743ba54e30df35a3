package cuda

import (
	"testing"
	"unsafe"
)

// The structs handed to cuLaunchKernelEx must match cuda.h byte for byte
// (checked with offsetof/sizeof against the headers of CUDA 11.8, 13.0 and
// 13.1: all agree).
func TestLaunchExLayout(t *testing.T) {
	var cfg launchConfig
	var at launchAttribute
	for _, c := range []struct {
		what      string
		got, want uintptr
	}{
		{"sizeof(CUlaunchConfig)", unsafe.Sizeof(cfg), 56},
		{"offsetof(CUlaunchConfig, sharedMemBytes)", unsafe.Offsetof(cfg.sharedMemBytes), 24},
		{"offsetof(CUlaunchConfig, hStream)", unsafe.Offsetof(cfg.hStream), 32},
		{"offsetof(CUlaunchConfig, attrs)", unsafe.Offsetof(cfg.attrs), 40},
		{"offsetof(CUlaunchConfig, numAttrs)", unsafe.Offsetof(cfg.numAttrs), 48},
		{"sizeof(CUlaunchAttribute)", unsafe.Sizeof(at), 72},
		{"offsetof(CUlaunchAttribute, value)", unsafe.Offsetof(at.value), 8},
		{"alignof(CUlaunchAttribute)", unsafe.Alignof(at), 8},
	} {
		if c.got != c.want {
			t.Errorf("%s = %d, cuda.h says %d", c.what, c.got, c.want)
		}
	}
	a := newParamArena()
	defer a.release()
	if a.cfg.attrs != uintptr(unsafe.Pointer(&a.attrs[0])) {
		t.Errorf("the arena's launch config does not point at its attributes")
	}
}
