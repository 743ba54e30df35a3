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
	// Per function (the module-wide test passed a spilling kernel as long
	// as another one did not spill).
	sp, fns := ptxasSpills(log)
	for name, n := range sp {
		t.Errorf("%s spills (%s bytes of spill stores)", name, n)
	}
	if fns < 3 {
		t.Errorf("ptxas -v named %d entry functions, want mla_prefill_wg, mla_prefill_wg2, mwg_probe", fns)
	}
	if !strings.Contains(log, "USETMAXREG") && strings.Contains(log, "setmaxnreg") && strings.Contains(strings.ToLower(log), "ignored") {
		t.Errorf("ptxas ignored mla_prefill_wg2's setmaxnreg:\n%s", log)
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
	if strings.Contains(KernelSource(), "mla_prefill_wg2") || !strings.Contains(WGKernelSource(), "extern \"C\" __global__ void __launch_bounds__(384, 1) mla_prefill_wg2(") {
		t.Fatal("mla_prefill_wg2 is not (only) in the sm_90a module")
	}
}

// ptxasSpills reads ptxas -v's log: the functions with spill stores (and
// how many bytes), and how many entry functions it names.
func ptxasSpills(log string) (spills map[string]string, fns int) {
	spills = map[string]string{}
	for _, part := range strings.Split(log, "Compiling entry function '")[1:] {
		name, _, _ := strings.Cut(part, "'")
		fns++
		if i := strings.Index(part, " bytes spill stores"); i >= 0 {
			f := strings.Fields(part[:i])
			if n := f[len(f)-1]; n != "0" {
				spills[name] = n
			}
		}
	}
	return spills, fns
}

func TestPtxasSpills(t *testing.T) {
	log := `ptxas info    : Compiling entry function 'a' for 'sm_90a'
ptxas         .     104 bytes stack frame, 116 bytes spill stores, 140 bytes spill loads
ptxas info    : Compiling entry function 'b' for 'sm_90a'
ptxas         .     0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
`
	sp, n := ptxasSpills(log)
	if n != 2 || len(sp) != 1 || sp["a"] != "116" {
		t.Fatalf("%v %d", sp, n)
	}
}
