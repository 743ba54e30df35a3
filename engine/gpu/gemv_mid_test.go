package gpu

import (
	"bytes"
	"fmt"
	"testing"

	"github.com/tilert-go/tilert/cuda/kernels"
	"github.com/tilert-go/tilert/engine"
	"github.com/tilert-go/tilert/engine/internal/enginetest"
)

// TILERT_GPU_GEMV_MID=1 and =2 (gemv_mid.go) must give exactly the tokens and
// cache bytes of the separate launches (TILERT_GPU_GROUP=0, switch off):
// one slot with and without MTP, two slots batched; and the one-row step
// graphs must hold the extra grouped launch (q_b + wq_b) that the switch
// adds. On the GPU the mid kernels must have run.
func TestEmuGemvMidProjections(t *testing.T) { testGemvMidProjections(t, onEmu) }
func TestGPUGemvMidProjections(t *testing.T) { testGemvMidProjections(t, onGPU) }

func testGemvMidProjections(t *testing.T, kind deviceKind) {
	if kind == onGPU {
		gpuDevice(t)
	}
	if !gemvTileOn {
		t.Skip("TILERT_GPU_GEMV_TILE=0: the switch is off with the tile kernels")
	}
	defer func(m, mid string) { groupMode, gemvMidMode = m, mid }(groupMode, gemvMidMode)
	n0 := kernels.GroupMidLaunches.Load()
	for _, pr := range enginetest.Presets {
		t.Run(pr, func(t *testing.T) {
			w, src := hfSourceOf(t, enginetest.PresetDir(t, pr))
			vocab := w.Config().VocabSize
			n := 12
			prompt := enginetest.Prompt(min(40, w.Config().IndexTopK-n-4), vocab, 7)
			for _, mtp := range []bool{false, true} {
				// (group mode, mid mode): the separate launches, the default,
				// mid =1 (q_a's norm in the q_b + wq_b launch), mid =2
				// (rmsnorm, then q_b + wq_b grouped).
				type mode struct {
					group, mid string
				}
				modes := []mode{{"0", ""}, {"", ""}, {"", "1"}, {"", "2"}}
				opts := engine.Options{MTP: mtp, MaxSeqLen: len(prompt) + n + 16, Slots: 2}
				toks := make([][]int, len(modes))
				caches := make([][]byte, len(modes))
				batch := make([][][]int, len(modes))
				groups := make([]int, len(modes))
				norms := make([]int, len(modes))
				for k, md := range modes {
					groupMode, gemvMidMode = md.group, md.mid
					e := newTestEngine(t, kind, src, opts)
					e.m.graphs.on, e.m.graphs.hold = true, true
					toks[k] = enginetest.GenerateKeep(t, e, 0, prompt, engine.Params{}, n)
					caches[k] = exportBytes(t, e, 0)
					e.Release(0)
					batch[k] = generateBatch(t, e, [][]int{prompt[:len(prompt)/2], prompt}, engine.Params{}, n)
					for _, run := range e.m.graphs.keep {
						for _, op := range run {
							switch op.name {
							case "gemvGroup":
								groups[k]++
							case "rmsnorm":
								norms[k]++
							}
						}
					}
					e.m.graphs.hold, e.m.graphs.keep = false, nil
					name := fmt.Sprintf("mtp=%v TILERT_GPU_GROUP=%q TILERT_GPU_GEMV_MID=%q", mtp, md.group, md.mid)
					t.Logf("%s %s: %d grouped launches, %d rmsnorm launches", kind, name, groups[k], norms[k])
					if k == 0 {
						continue
					}
					if i := enginetest.FirstDiff(toks[k], toks[0]); i >= 0 {
						t.Errorf("%s: tokens differ from separate launches at %d:\n got %v\nwant %v", name, i, toks[k], toks[0])
					}
					if !bytes.Equal(caches[k], caches[0]) {
						t.Errorf("%s: caches differ from separate launches", name)
					}
					for s := range batch[0] {
						if i := enginetest.FirstDiff(batch[k][s], batch[0][s]); i >= 0 {
							t.Errorf("%s batched slot %d: tokens differ from separate launches at %d", name, s, i)
						}
					}
				}
				// One-row steps (no MTP) group q_b + wq_b too: more grouped
				// launches; with =1 the q_a rmsnorm goes into that launch.
				if !mtp {
					for k := 2; k <= 3; k++ {
						if groups[k] <= groups[1] {
							t.Errorf("mtp=false TILERT_GPU_GEMV_MID=%s: %d grouped launches, the default %d: q_b + wq_b not grouped", modes[k].mid, groups[k], groups[1])
						}
					}
					if norms[2] >= norms[1] || norms[3] != norms[1] {
						t.Errorf("mtp=false: rmsnorm launches %d (=1), %d (=2), the default %d: want fewer with =1, as many with =2", norms[2], norms[3], norms[1])
					}
				}
			}
		})
	}
	if kind == onGPU {
		if n := kernels.GroupMidLaunches.Load() - n0; n == 0 {
			t.Fatal("TILERT_GPU_GEMV_MID=1: no grouped launch ran a gemv_mid_group kernel")
		} else {
			t.Logf("gemv_mid_group ran %d launches", n)
		}
	}
}

// TestGPUGemvMid: greedy decoding == the CPU engine and the goldens with
// TILERT_GPU_GEMV_MID=1 and =2 (set here, whatever the environment), and
// the mid kernels actually ran in each.
func TestGPUGemvMid(t *testing.T) {
	gpuDevice(t)
	if !gemvTileOn {
		t.Skip("TILERT_GPU_GEMV_TILE=0: the switch is off with the tile kernels")
	}
	defer func(m string) { gemvMidMode = m }(gemvMidMode)
	for _, mode := range []string{"1", "2"} {
		t.Run("mode="+mode, func(t *testing.T) {
			gemvMidMode = mode
			n0 := kernels.GroupMidLaunches.Load()
			testGreedyCases(t, onGPU, engine.CacheFP8DSMLA, genCases, " gemv mid="+mode)
			testGolden(t, onGPU)
			n := kernels.GroupMidLaunches.Load() - n0
			if n == 0 {
				t.Fatalf("TILERT_GPU_GEMV_MID=%s: no grouped launch ran a gemv_mid_group kernel", mode)
			}
			t.Logf("TILERT_GPU_GEMV_MID=%s: gemv_mid_group ran %d launches", mode, n)
		})
	}
}
