package kernels

import (
	"slices"
	"testing"

	"github.com/tilert-go/tilert/cuda"
)

// TestNVRTCRouterRouteRegisters: router_route.cu compiles for sm_90 with
// what it runs of the default module (gemv_wide.cu's rows, moe.cu's rank
// routing), and each fused kernel keeps its plain twin's four blocks an SM
// (at most 64 registers). A source error fails here (ptxasLogSM90 alone
// would read it as NVRTC refusing -Xptxas -v). Spills are logged.
func TestNVRTCRouterRouteRegisters(t *testing.T) {
	src := moduleSource(kernelFS, "cu/router_route.cu", "cu/gemv.cu", "cu/gemv_wide.cu", "cu/moe.cu")
	if nv, err := cuda.LoadNVRTC(); err == nil && slices.Contains(nv.SupportedArchs(), 90) {
		if _, log, err := nv.CompileLog(src, "router_route.cu", kernelOptions("sm_90"), false); err != nil {
			t.Fatalf("router_route.cu does not compile (NVRTC %s): %v\n%s", nv.Version(), err, log)
		}
	}
	log, version := ptxasLogSM90(t, src, "router_route.cu")
	sp, _ := ptxasSpills(log)
	regs := ptxasRegisters(log)
	for _, r := range []int{1, 2, 4, 8} {
		for _, name := range []string{fmtWide(r), fmtWide(r) + "_rt"} {
			n, ok := regs[name]
			switch {
			case !ok:
				t.Errorf("%s: not in ptxas -v's log", name)
			case n > 64:
				t.Errorf("%s: %d registers, want at most 64 (four blocks of 256 an SM)", name, n)
			}
			if b, bad := sp[name]; bad {
				t.Logf("%s spills %s bytes (NVRTC %s)", name, b, version)
			}
			t.Logf("%s: %d registers (NVRTC %s)", name, n, version)
		}
	}
}

func fmtWide(r int) string { return "gemv_bf16_wide_r" + string(rune('0'+r)) }
