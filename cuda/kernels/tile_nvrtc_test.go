package kernels

import "testing"

// TestNVRTCTileLoadsInFlight: gemv_tile.cu (after common.cuh and
// gemv_tile.cuh, as the default module has them) compiles for sm_90, and the
// variants that keep 16 loads in flight (_d16) fit two blocks an SM: at most
// 128 registers a thread, and the split-K form of _o4 four: at most 64.
// Their spills are logged: they vary with the NVRTC version (r8_m1_d16: 0
// to 8 bytes) and were measured as they are.
func TestNVRTCTileLoadsInFlight(t *testing.T) {
	log, version := ptxasLogSM90(t, moduleSource(kernelFS, "cu/gemv_tile.cu", gemvTileHeader), "gemv_tile.cu")
	// 128: two blocks an SM.
	checkRegisters(t, log, version, []regLimit{
		{"gemv_tile_fp8_r2_m1_d16", 128}, {"gemv_tile_fp8_r4_m1_d16", 128}, {"gemv_tile_fp8_r8_m1_d16", 128},
		{"gemv_tile_fp8_r8_m1_o4", 64}, {"gemv_tile_fp8_r8_m1_o4k", 64},
	})
}
