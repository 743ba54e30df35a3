package kernels

import (
	"slices"
	"testing"

	"github.com/tilert-go/tilert/cuda"
)

// TestNVRTCGroupNoNormRegisters: the grouped GEMV's one-row kernels compile
// with NVRTC for sm_90 (no GPU needed) and their registers and spills are
// logged: three 256-thread blocks an SM (<= 80 registers) start the layer
// input's 288 blocks in one wave on 132 SMs; at two an SM, 24 wait for a
// second. _nn2 is held to 80 by its bounds, _nn2b must not spill.
func TestNVRTCGroupNoNormRegisters(t *testing.T) {
	nv, err := cuda.LoadNVRTC()
	if err != nil {
		t.Skipf("no NVRTC here, compile check skipped: %v", err)
	}
	if !slices.Contains(nv.SupportedArchs(), 90) {
		t.Skipf("NVRTC %s has no sm_90", nv.Version())
	}
	src := moduleSource(kernelFS, "cu/gemv_tile_group.cu", defaultHeaders...)
	_, log, err := nv.CompileLog(src, "gemv_tile_group.cu", append(kernelOptions("sm_90"), "-Xptxas", "-v"), true)
	if err != nil {
		t.Skipf("NVRTC %s refused -Xptxas -v (registers not shown): %v", nv.Version(), err)
	}
	sp, _ := ptxasSpills(log)
	regs := ptxasRegisters(log)
	for _, name := range []string{"gemv_group_r8_m1", "gemv_group_r8_m1_nn", "gemv_group_r8_m1_nn2", "gemv_group_r8_m1_nn2b"} {
		r, ok := regs[name]
		if !ok {
			t.Errorf("%s: not in ptxas -v's log", name)
			continue
		}
		t.Logf("%s: %d registers, spill stores %q bytes (NVRTC %s)", name, r, sp[name], nv.Version())
	}
	// _nn2's bounds hold it to three blocks an SM; _nn2b is the unbounded
	// form, which must not spill.
	if r := regs["gemv_group_r8_m1_nn2"]; r > 80 {
		t.Errorf("gemv_group_r8_m1_nn2: %d registers, over the 80 of three 256-thread blocks an SM", r)
	}
	if n, ok := sp["gemv_group_r8_m1_nn2b"]; ok {
		t.Errorf("gemv_group_r8_m1_nn2b spills (%s bytes of spill stores)", n)
	}
}
