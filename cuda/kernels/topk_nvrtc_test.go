package kernels

import (
	"slices"
	"testing"

	"github.com/tilert-go/tilert/cuda"
)

// TestNVRTCTopKListWRegisters: topk_radix.cu compiles with NVRTC for sm_90
// (no GPU needed) and topk_radix_mark_lw keeps topk_radix_mark_l's 32
// registers without spilling: at 1024 threads that is 32768 registers, so
// a mark block launched early (PDL) shares its SM with one of q_b's blocks
// (128 registers x 256 threads), as mark_l's do; at 44 (its unbounded
// count under NVRTC 12.9) it would not.
func TestNVRTCTopKListWRegisters(t *testing.T) {
	nv, err := cuda.LoadNVRTC()
	if err != nil {
		t.Skipf("no NVRTC here, compile check skipped: %v", err)
	}
	if !slices.Contains(nv.SupportedArchs(), 90) {
		t.Skipf("NVRTC %s has no sm_90", nv.Version())
	}
	src := moduleSource(kernelFS, "cu/topk_radix.cu", defaultHeaders...)
	_, log, err := nv.CompileLog(src, "topk_radix.cu", append(kernelOptions("sm_90"), "-Xptxas", "-v"), true)
	if err != nil {
		t.Skipf("NVRTC %s refused -Xptxas -v (registers not shown): %v", nv.Version(), err)
	}
	sp, _ := ptxasSpills(log)
	regs := ptxasRegisters(log)
	const name = "topk_radix_mark_lw"
	r, ok := regs[name]
	if !ok {
		t.Fatalf("%s: not in ptxas -v's log", name)
	}
	t.Logf("%s: %d registers (NVRTC %s); topk_radix_mark_l %d", name, r, nv.Version(), regs["topk_radix_mark_l"])
	if n, ok := sp[name]; ok {
		t.Errorf("%s spills (%s bytes of spill stores)", name, n)
	}
	if r > 32 {
		t.Errorf("%s: %d registers, over the 32 of a 1024-thread block beside one of q_b's", name, r)
	}
}
