package kernels

import (
	"testing"

	"github.com/tilert-go/tilert/cuda"
)

// TestNVRTCCompilesFewModule: the few-heads module (cu/few/) compiles with
// NVRTC for sm_90 (no GPU needed), every kernel is there and none spills.
func TestNVRTCCompilesFewModule(t *testing.T) {
	nv, err := cuda.LoadNVRTC()
	if err != nil {
		t.Skipf("no NVRTC here, compile check skipped: %v", err)
	}
	ck, err := CompileFew(nv, 9, 0, cuda.KernelCache{Dir: t.TempDir()})
	if err != nil {
		t.Fatalf("%+v", err)
	}
	t.Logf("NVRTC %s: %s module %d bytes in %v", nv.Version(), ck.Arch, len(ck.Image), ck.Took)
	arch := "sm_90"
	if !ck.Cubin {
		arch = "compute_90"
	}
	_, log, err := nv.CompileLog(FewKernelSource(), "tilert_kernels_few.cu", append(kernelOptions(arch), "-Xptxas", "-v"), ck.Cubin)
	if err != nil {
		t.Logf("NVRTC %s refused -Xptxas -v (registers and spills not shown): %v", nv.Version(), err)
		return
	}
	t.Logf("ptxas -v:\n%s", log)
	sp, fns := ptxasSpills(log)
	for name, n := range sp {
		t.Errorf("%s spills (%s bytes of spill stores)", name, n)
	}
	if ck.Cubin && fns < 5 {
		t.Errorf("ptxas -v named %d entry functions, want mla_decode_few, mla_combine_few and topk_fast16/32/64", fns)
	}
}
