package gpu

import (
	"slices"
	"testing"

	"github.com/tilert-go/tilert/engine"
	"github.com/tilert-go/tilert/engine/internal/enginetest"
)

// The routing probe (bench decode's count of the experts a step touched):
// a probed step of three slots, two of them the same prompt, hands back
// every MoE layer's routing in layer order, the same-prompt rows on the same
// experts, each row's picks distinct and in range; the probe changes no
// token; off, it collects nothing.
func TestEmuRoutingProbe(t *testing.T) { testRoutingProbe(t, onEmu) }
func TestGPURoutingProbe(t *testing.T) { testRoutingProbe(t, onGPU) }

func testRoutingProbe(t *testing.T, kind deviceKind) {
	if kind == onGPU {
		gpuDevice(t)
	}
	for _, pr := range enginetest.Presets {
		t.Run(pr, func(t *testing.T) {
			w, src := hfSourceOf(t, enginetest.PresetDir(t, pr))
			c := w.Config()
			a, b := enginetest.Prompt(24, c.VocabSize, 3), enginetest.Prompt(24, c.VocabSize, 5)
			prompts := [][]int{a, a, b}
			run := func(probe bool) ([][]int, []RoutedLayer) {
				e := newTestEngine(t, kind, src, engine.Options{MaxSeqLen: 64, Slots: 3})
				slots := []int{0, 1, 2}
				for s, p := range prompts {
					first, err := e.Prefill(s, p, engine.Params{})
					if err != nil {
						t.Fatal(err)
					}
					if _, err := e.Start(s, first, engine.Params{MaxTokens: 8}); err != nil {
						t.Fatal(err)
					}
				}
				var toks [][]int
				var got []RoutedLayer
				for i := range 3 {
					if err := e.SetRoutingProbe(probe && i == 1); err != nil {
						t.Fatal(err)
					}
					out, err := e.Step(slots)
					if err != nil {
						t.Fatal(err)
					}
					for _, sr := range out {
						toks = append(toks, sr.Tokens)
					}
					if err := e.SetRoutingProbe(false); err != nil {
						t.Fatal(err)
					}
					if r := e.RoutedLayers(); i == 1 {
						got = r
					} else if len(r) != 0 {
						t.Errorf("step %d (probe off): %d routed layers collected, want none", i, len(r))
					}
				}
				return toks, got
			}
			plain, _ := run(false)
			probed, layers := run(true)
			if !slices.EqualFunc(plain, probed, slices.Equal[[]int]) {
				t.Errorf("the probe changed the tokens: %v, without it %v", probed, plain)
			}
			var want []int
			for i := range c.NumLayers {
				if c.IsMoELayer(i) {
					want = append(want, i)
				}
			}
			var gotL []int
			K, E := c.NumExpertsPerTok, c.NRoutedExperts
			for _, l := range layers {
				gotL = append(gotL, l.Layer)
				if l.Rows != 3 || len(l.IDs) != 3*K {
					t.Errorf("layer %d: %d rows, %d ids (want 3 rows of %d)", l.Layer, l.Rows, len(l.IDs), K)
					continue
				}
				for r := range 3 {
					row := slices.Clone(l.IDs[r*K : (r+1)*K])
					slices.Sort(row)
					if row[0] < 0 || int(row[K-1]) >= E || len(slices.Compact(row)) != K {
						t.Errorf("layer %d row %d: ids %v (want %d distinct in [0, %d))", l.Layer, r, l.IDs[r*K:(r+1)*K], K, E)
					}
				}
				if !slices.Equal(l.IDs[:K], l.IDs[K:2*K]) {
					t.Errorf("layer %d: the two rows of one prompt routed apart: %v and %v", l.Layer, l.IDs[:K], l.IDs[K:2*K])
				}
			}
			if !slices.Equal(gotL, want) {
				t.Errorf("probed layers %v, want the MoE layers %v", gotL, want)
			}
		})
	}
}
