package kernels

import "testing"

// TestNVRTCFusedTileRegisters: wqb_iq.cu compiles for sm_90 with what it
// runs of the default module (the tile body, attn_epilogue's block 0,
// idx_q_prep's head macro), and each fused wq_b kernel keeps its plain
// twin's blocks an SM: _d16 at most 128 registers (two blocks), _o4 at most
// 80 (three of the plain kernel's four: see its kernels). Spills are logged
// (they vary with the NVRTC version).
func TestNVRTCFusedTileRegisters(t *testing.T) {
	src := moduleSource(kernelFS, "cu/wqb_iq.cu", gemvTileHeader, topkRadixHeader, "cu/engine.cu", "cu/indexer.cu",
		"cu/fused.cu", "cu/gemv_tile.cu", "cu/indexer_mma.cu")
	log, version := ptxasLogSM90(t, src, "wqb_iq.cu")
	checkRegisters(t, log, version, []regLimit{
		{"gemv_tile_fp8_r8_m1_iq", 255}, {"gemv_tile_fp8_r8_m1_d16_iq", 128}, {"gemv_tile_fp8_r8_m1_o4_iq", 80},
		{"gemv_tile_fp8_r4_m1_iq", 255}, {"gemv_tile_fp8_r4_m1_d16_iq", 128}, {"gemv_tile_fp8_r4_m1_o4_iq", 80},
		{"gemv_tile_fp8_r2_m1_iq", 255}, {"gemv_tile_fp8_r2_m1_d16_iq", 128}, {"gemv_tile_fp8_r1_m1_iq", 255},
	})
}
