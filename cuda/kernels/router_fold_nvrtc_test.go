package kernels

import "testing"

// TestNVRTCRouterFoldRegisters: router_fold.cu compiles for sm_90 with what
// it calls of the default module (moe_route_rank_row, add_rmsnorm_row), and
// add_rmsnorm_route fits its 1024-thread blocks (at most 64 registers), as
// add_rmsnorm_reg does. Spills are logged (they vary with the NVRTC
// version).
func TestNVRTCRouterFoldRegisters(t *testing.T) {
	src := moduleSource(kernelFS, "cu/router_fold.cu", "cu/moe.cu", "cu/norm.cu")
	log, version := ptxasLogSM90(t, src, "router_fold.cu")
	checkRegisters(t, log, version, []regLimit{{"add_rmsnorm_route", 64}, {"router_fold_a", 255}, {"router_fold_m", 255}})
}
