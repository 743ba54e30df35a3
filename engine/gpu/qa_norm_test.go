package gpu

import (
	"strings"
	"sync/atomic"
	"testing"

	"github.com/cockroachdb/errors"

	"github.com/tilert-go/tilert/cuda/kernels"
	"github.com/tilert-go/tilert/engine"
	"github.com/tilert-go/tilert/engine/internal/enginetest"
)

func TestParseQANorm(t *testing.T) {
	for _, c := range []struct {
		in   string
		late bool
		bad  bool
	}{{"", true, false}, {"launch", false, false}, {"late", true, false}, {"LATE", false, true}, {"1", false, true}} {
		late, err := parseQANorm(c.in)
		switch {
		case c.bad && (err == nil || !strings.Contains(err.Error(), "TILERT_GPU_QA_NORM") || len(errors.GetAllHints(err)) == 0):
			t.Errorf("%q: %v, want an error naming the switch, with a hint", c.in, err)
		case !c.bad && (err != nil || late != c.late):
			t.Errorf("%q: %v, %v; want %v", c.in, late, err, c.late)
		}
	}
}

// TILERT_GPU_QA_NORM=late (the default) and =launch each give the CPU
// engine's greedy tokens on both tiny presets, MTP on and off, one slot and
// two (the two-row steps keep the norm launch); it fails unless the late
// form ran under late and only there: on the emulator its group's sums, on
// the GPU gemv_group_r8_m1_qw and absorb_q_fast_..._n.
func TestEmuQANormLate(t *testing.T) { testQANormLate(t, onEmu) }

func TestGPUQANormLate(t *testing.T) {
	gpuDevice(t)
	testQANormLate(t, onGPU)
}

func testQANormLate(t *testing.T, kind deviceKind) {
	defer func(v bool) { qaNormLate = v }(qaNormLate)
	counters := map[string]*atomic.Int64{"the emulator's late group": &emuQALate}
	if kind == onGPU {
		counters = map[string]*atomic.Int64{"gemv_group_r8_m1_qw": &kernels.GroupQWLaunches,
			"absorb_q_fast_..._n": &kernels.AbsorbQScaledLaunches}
	}
	for _, m := range []struct {
		mode string
		late bool
	}{{"late", true}, {"launch", false}} {
		mode, late := m.mode, m.late
		qaNormLate = late
		n0 := map[string]int64{}
		for k, n := range counters {
			n0[k] = n.Load()
		}
		testGreedyCases(t, kind, engine.CacheFP8DSMLA, genCases, " (TILERT_GPU_QA_NORM="+mode+")")
		for k, n := range counters {
			if ran := n.Load() != n0[k]; ran != late {
				t.Errorf("%s: TILERT_GPU_QA_NORM=%s: %s ran %v", kind, mode, k, ran)
			}
		}
	}
}

// With =late a one-row step's recorded runs hold one RMSNorm launch fewer
// per attention layer (q_a's), and absorbQ and every epilogue carrying the
// indexer's query take the scale; a two-slot step keeps them all.
func TestEmuQANormLateLaunches(t *testing.T) {
	defer func(v bool) { qaNormLate = v }(qaNormLate)
	for _, pr := range enginetest.Presets {
		t.Run(pr, func(t *testing.T) {
			w, src := hfSourceOf(t, enginetest.PresetDir(t, pr))
			cfg := w.Config()
			prompt := enginetest.Prompt(cfg.IndexTopK+30, cfg.VocabSize, 5)
			count := func(late bool, slots int) (norms, scaled int) {
				qaNormLate = late
				e := newTestEngine(t, onEmu, src, engine.Options{MaxSeqLen: len(prompt) + 16, Slots: slots})
				e.m.graphs.keep = [][]gop{}
				prompts := [][]int{prompt, prompt[:len(prompt)-3]}[:slots]
				generateBatch(t, e, prompts, engine.Params{}, 4)
				for _, run := range e.m.graphs.keep {
					for _, op := range run {
						switch op.name {
						case "rmsnorm":
							norms++
						case "gemvGroupQW":
							scaled++
						}
					}
				}
				return norms, scaled
			}
			for _, slots := range []int{1, 2} {
				n0, s0 := count(false, slots)
				n1, s1 := count(true, slots)
				if s0 != 0 {
					t.Errorf("slots=%d: %d late groups with the switch off", slots, s0)
				}
				if slots == 1 && (s1 == 0 || n0-n1 != s1) {
					t.Errorf("slots=%d: RMSNorm launches %d -> %d with %d late groups: want one fewer per late group", slots, n0, n1, s1)
				}
				if slots == 2 && (s1 != 0 || n1 != n0) {
					t.Errorf("slots=%d: %d late groups, RMSNorm launches %d -> %d: two-row steps keep the norm", slots, s1, n0, n1)
				}
			}
		})
	}
}
