package gpu

import (
	"fmt"
	"testing"

	"github.com/tilert-go/tilert/cuda/kernels"
	"github.com/tilert-go/tilert/engine/internal/enginetest"
)

// TILERT_GPU_IDX_QFUSE=1 (wqbIQOn): a one-row step's wq_b and attention
// epilogue as one wqbIdxQ launch. The same tokens, cache bytes and batched
// tokens as the two launches, with and without MTP, on prompts within and
// past index_topk; every wqbIdxQ replaces exactly one wq_b GEMV and one
// attnEpilogue in the recorded graphs, and one-row steps take it. On the
// GPU it also fails unless the fused kernel launched (the tiny presets'
// wq_b plans have one).
func TestEmuWQBIdxQ(t *testing.T) { testWQBIdxQ(t, onEmu) }
func TestGPUWQBIdxQ(t *testing.T) { testWQBIdxQ(t, onGPU) }

func testWQBIdxQ(t *testing.T, kind deviceKind) {
	if kind == onGPU {
		gpuDevice(t)
	}
	if !gemvTileOn || !fuseOn {
		t.Skip("TILERT_GPU_GEMV_TILE=0 or TILERT_GPU_FUSE=0: the fused wq_b needs the tile GEMVs and the fused epilogue")
	}
	defer func(on bool) { wqbIQOn = on }(wqbIQOn)
	n0 := kernels.WQBIdxQLaunches()
	for _, pr := range enginetest.Presets {
		t.Run(pr, func(t *testing.T) {
			for _, past := range []bool{false, true} {
				c := newSwitchCase(t, pr)
				if past {
					c = newSwitchCasePast(t, pr)
				}
				for _, mtp := range []bool{false, true} {
					name := fmt.Sprintf("%s past=%v mtp=%v TILERT_GPU_IDX_QFUSE=1", kind, past, mtp)
					wqbIQOn = false
					ref := c.run(t, kind, mtp)
					wqbIQOn = true
					got := c.run(t, kind, mtp)
					got.sameAs(t, ref, name, "two launches")
					f := got.ops["wqbIdxQ"]
					t.Logf("%s: %d fused launches in the graphs; attnEpilogue %d -> %d, gemvFP8 %d -> %d", name, f,
						ref.ops["attnEpilogue"], got.ops["attnEpilogue"], ref.ops["gemvFP8"], got.ops["gemvFP8"])
					if f == 0 {
						t.Errorf("%s: no step graph ran wqbIdxQ", name)
					}
					if got.ops["attnEpilogue"]+f != ref.ops["attnEpilogue"] || got.ops["gemvFP8"]+f != ref.ops["gemvFP8"] {
						t.Errorf("%s: %d fused launches do not replace one attnEpilogue and one gemvFP8 each (%d -> %d, %d -> %d)",
							name, f, ref.ops["attnEpilogue"], got.ops["attnEpilogue"], ref.ops["gemvFP8"], got.ops["gemvFP8"])
					}
					if ref.ops["wqbIdxQ"] != 0 {
						t.Errorf("%s: the two-launch run recorded wqbIdxQ", name)
					}
				}
			}
		})
	}
	if kind == onGPU && kernels.WQBIdxQLaunches() == n0 {
		t.Fatal("TILERT_GPU_IDX_QFUSE=1: the fused wq_b kernel never launched")
	}
}
