package kernels

import (
	"slices"
	"testing"

	"github.com/tilert-go/tilert/cuda"
)

// TestNVRTCCompilesTopKOne: topk_radix.cu alone (after common.cuh and
// topk_radix.cuh, as the default module has them) compiles with NVRTC for
// sm_90 (no GPU needed), and topk_radix_one_w* does not spill at 1024
// threads (64 registers a thread at most; the 32-key body
// sits at the limit); the pre-sm_80 branch compiles to PTX.
// topk_radix_mark_lw keeps topk_radix_mark_l's 32 registers without
// spilling: at 1024 threads that is 32768 registers, so a mark block
// launched early (PDL) shares its SM with one of q_b's blocks (128
// registers x 256 threads), as mark_l's do; unbounded it took 44 (NVRTC
// 12.9).
func TestNVRTCCompilesTopKOne(t *testing.T) {
	nv, err := cuda.LoadNVRTC()
	if err != nil {
		t.Skipf("no NVRTC here, compile check skipped: %v", err)
	}
	src := moduleSource(kernelFS, "cu/topk_radix.cu", topkRadixHeader)
	cubin := slices.Contains(nv.SupportedArchs(), 90)
	arch := "compute_90"
	if cubin {
		arch = "sm_90"
	}
	_, log, err := nv.CompileLog(src, "topk_radix.cu", append(kernelOptions(arch), "-Xptxas", "-v"), cubin)
	if err != nil {
		t.Logf("NVRTC %s refused -Xptxas -v (registers and spills not shown): %v", nv.Version(), err)
		if _, err := nv.Compile(src, "topk_radix.cu", kernelOptions(arch), cubin); err != nil {
			t.Fatalf("%+v", err)
		}
		return
	}
	sp, fns := ptxasSpills(log)
	for _, name := range []string{"topk_radix_one_w8", "topk_radix_one_w16", "topk_radix_one_w32", "topk_radix_one_w12", "topk_radix_mark_lw"} {
		if n, ok := sp[name]; ok {
			t.Errorf("%s spills (%s bytes of spill stores)", name, n)
		}
	}
	if cubin && fns < 8 {
		t.Errorf("ptxas -v named %d entry functions, want topk_radix.cu's 8", fns)
	}
	if cubin {
		regs := ptxasRegisters(log)
		r, ok := regs["topk_radix_mark_lw"]
		switch {
		case !ok:
			t.Errorf("topk_radix_mark_lw: not in ptxas -v's log")
		case r > 32:
			t.Errorf("topk_radix_mark_lw: %d registers, over the 32 of a 1024-thread block beside one of q_b's", r)
		}
		t.Logf("topk_radix_mark_lw %d registers, topk_radix_mark_l %d", r, regs["topk_radix_mark_l"])
	}
	t.Logf("NVRTC %s, %s: %d entry functions", nv.Version(), arch, fns)
	// Below sm_80 tkw_warp_sum is shuffles instead of redux.sync: that
	// branch must compile too.
	if slices.Contains(nv.SupportedArchs(), 75) {
		if _, err := nv.Compile(src, "topk_radix.cu", kernelOptions("compute_75"), false); err != nil {
			t.Errorf("compute_75: %+v", err)
		}
	}
}
