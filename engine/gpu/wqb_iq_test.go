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
// past index_topk; every fused op replaces exactly one of each launch it
// fuses in the recorded graphs, and one-row steps take it. On the GPU it
// also fails unless the fused kernel launched (the tiny presets' plans have
// one). (TILERT_GPU_OPROJ_NORM's fused o_proj + add-norm shared this check
// until it was removed after session 34.)
func TestEmuWQBIdxQ(t *testing.T) { testFusedSwitch(t, onEmu, wqbSwitch) }
func TestGPUWQBIdxQ(t *testing.T) { testFusedSwitch(t, onGPU, wqbSwitch) }

// fusedSwitch is an opt-in launch that fuses two: its switch variable, its
// recorded op and the ops it replaces, and the kernels' launch count.
type fusedSwitch struct {
	env      string
	on       *bool
	op       string
	replaces [2]string
	launches func() int64
}

var wqbSwitch = fusedSwitch{"TILERT_GPU_IDX_QFUSE", &wqbIQOn, "wqbIdxQ", [2]string{"attnEpilogue", "gemvFP8"},
	kernels.WQBIdxQLaunches}

func testFusedSwitch(t *testing.T, kind deviceKind, sw fusedSwitch) {
	if kind == onGPU {
		gpuDevice(t)
	}
	if !gemvTileOn || !fuseOn {
		t.Skip("TILERT_GPU_GEMV_TILE=0 or TILERT_GPU_FUSE=0: the fused launches need the tile GEMVs and the fused epilogue")
	}
	defer func(on bool) { *sw.on = on }(*sw.on)
	n0 := sw.launches()
	for _, pr := range enginetest.Presets {
		t.Run(pr, func(t *testing.T) {
			for _, past := range []bool{false, true} {
				c := newSwitchCase(t, pr)
				if past {
					c = newSwitchCasePast(t, pr)
				}
				for _, mtp := range []bool{false, true} {
					name := fmt.Sprintf("%s past=%v mtp=%v %s=1", kind, past, mtp, sw.env)
					*sw.on = false
					ref := c.run(t, kind, mtp)
					*sw.on = true
					got := c.run(t, kind, mtp)
					got.sameAs(t, ref, name, "two launches")
					f := got.ops[sw.op]
					a, b := sw.replaces[0], sw.replaces[1]
					t.Logf("%s: %d %s in the graphs; %s %d -> %d, %s %d -> %d", name, f, sw.op, a, ref.ops[a], got.ops[a],
						b, ref.ops[b], got.ops[b])
					if f == 0 {
						t.Errorf("%s: no step graph ran %s", name, sw.op)
					}
					if got.ops[a]+f != ref.ops[a] || got.ops[b]+f != ref.ops[b] {
						t.Errorf("%s: %d %s do not replace one %s and one %s each (%d -> %d, %d -> %d)",
							name, f, sw.op, a, b, ref.ops[a], got.ops[a], ref.ops[b], got.ops[b])
					}
					if ref.ops[sw.op] != 0 {
						t.Errorf("%s: the two-launch run recorded %s", name, sw.op)
					}
				}
			}
		})
	}
	if kind == onGPU && sw.launches() == n0 {
		t.Fatalf("%s=1: the fused kernel never launched", sw.env)
	}
}
