package kernels

import (
	"errors"
	"strings"
	"testing"

	"github.com/tilert-go/tilert/cuda"
)

// The sm_90a module compiles with an NVRTC that builds sm_90a (12+; here
// TILERT_NVRTC=/opt/nvrtc12/... for the check, the device's 13.0 there); an
// older NVRTC (11.8) skips it with the reason. NVRTC's log (ptxas
// warnings: wgmma serialisation, spills) is printed when non-empty.
func TestNVRTCCompilesWGModule(t *testing.T) {
	nv, err := cuda.LoadNVRTC()
	if err != nil {
		t.Skipf("no NVRTC here, compile check skipped: %v", err)
	}
	if !nv.CanCompileSM90a() {
		t.Skipf("NVRTC %s (%s) cannot compile sm_90a: the wgmma module (cu/wg/) is not checked here; set TILERT_NVRTC to a libnvrtc.so.12 or newer", nv.Version(), nv.Lib)
	}
	ck, err := CompileWG(nv, cuda.KernelCache{Dir: t.TempDir()})
	if err != nil {
		t.Fatalf("%+v", err)
	}
	if ck.Arch != "sm_90a" || !ck.Cubin || len(ck.Image) < 1000 {
		t.Fatalf("arch %s cubin %v, %d bytes", ck.Arch, ck.Cubin, len(ck.Image))
	}
	t.Logf("NVRTC %s: %s module %d bytes in %v, options %q", nv.Version(), ck.Arch, len(ck.Image), ck.Took, ck.Options)
	// Registers and spills: ptxas -v through NVRTC (its log).
	img, log, err := nv.CompileLog(WGKernelSource(), "tilert_kernels_wg.cu", append(kernelOptions("sm_90a"), "-Xptxas", "-v"), true)
	if err != nil {
		t.Logf("NVRTC %s refused -Xptxas -v (registers and spills not shown): %v", nv.Version(), err)
		return
	}
	t.Logf("ptxas -v (%d bytes):\n%s", len(img), log)
	if strings.Contains(log, "bytes spill stores") && !strings.Contains(log, " 0 bytes spill stores") {
		t.Errorf("mla_prefill_wg spills:\n%s", log)
	}
	if strings.Contains(log, "wgmma") && strings.Contains(strings.ToLower(log), "serializ") {
		t.Logf("NOTE: ptxas serialises the wgmma pipeline (see the log above)")
	}
}

// The sm_90a module is refused with ErrNoSM90a by an NVRTC that cannot
// build it (11.8 here without TILERT_NVRTC).
func TestWGModuleNeedsSM90a(t *testing.T) {
	nv, err := cuda.LoadNVRTC()
	if err != nil {
		t.Skipf("no NVRTC: %v", err)
	}
	if nv.CanCompileSM90a() {
		t.Skipf("NVRTC %s can compile sm_90a", nv.Version())
	}
	if _, err := CompileWG(nv, cuda.KernelCache{Dir: t.TempDir()}); !errors.Is(err, cuda.ErrNoSM90a) {
		t.Fatalf("NVRTC %s: %v, want ErrNoSM90a", nv.Version(), err)
	}
}

// The main module does not contain the sm_90a kernels, and the sm_90a
// module holds only cu/wg/ (and common.cuh).
func TestWGModuleSeparate(t *testing.T) {
	if strings.Contains(KernelSource(), "mla_prefill_wg") {
		t.Fatal("the main module's source holds mla_prefill_wg")
	}
	if !strings.Contains(WGKernelSource(), "extern \"C\" __global__ void __launch_bounds__(256, 1) mla_prefill_wg(") {
		t.Fatal("the sm_90a module lacks mla_prefill_wg")
	}
}
