package converter

import (
	"bytes"
	"slices"
	"testing"

	"github.com/tilert-go/tilert/engine"
	"github.com/tilert-go/tilert/engine/cpu"
	"github.com/tilert-go/tilert/model"
	"github.com/tilert-go/tilert/weights"
)

// run drives one request through a CPU engine: prefill, then decode n tokens.
func run(t *testing.T, e *cpu.Engine, prompt []int, p engine.Params, n int) (toks []int, state []byte) {
	t.Helper()
	first, err := e.Prefill(0, prompt, p)
	if err != nil {
		t.Fatal(err)
	}
	_, segs, err := e.Export(0)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range segs {
		state = append(state, s.Data...)
	}
	p.MaxTokens = n
	toks = []int{first}
	fin, err := e.Start(0, first, p)
	if err != nil {
		t.Fatal(err)
	}
	for fin == engine.FinishNone {
		res, err := e.Step([]int{0})
		if err != nil {
			t.Fatal(err)
		}
		toks = append(toks, res[0].Tokens...)
		fin = res[0].Finish
	}
	e.Release(0)
	return toks, state
}

// TestEngineSameOnConverted: the CPU engine on converted weights generates exactly what it
// generates on the HF checkpoint, and its prefill leaves byte-identical cache state (greedy with
// and without MTP, seeded sampling, exact and serving modes).
func TestEngineSameOnConverted(t *testing.T) {
	for _, p := range presets {
		t.Run(p, func(t *testing.T) {
			src := presetDir(t, p)
			out, _ := convertTo(t, src, func(o *Options) { o.Devices = 2 })
			hfCfg, err := model.LoadConfig(src)
			if err != nil {
				t.Fatal(err)
			}
			hfW, err := model.OpenWeights(src)
			if err != nil {
				t.Fatal(err)
			}
			cw, cCfg, err := weights.OpenWeights(out)
			if err != nil {
				t.Fatal(err)
			}
			defer cw.(*weights.Dir).Close()
			prompt := make([]int, 40)
			for i := range prompt {
				prompt[i] = (i*37 + 11) % hfCfg.VocabSize
			}
			for _, tc := range []struct {
				name string
				opts engine.Options
				par  engine.Params
			}{
				{"exact greedy", engine.Options{Mode: engine.ModeExact, MaxSeqLen: 256}, engine.Params{}},
				{"exact greedy mtp", engine.Options{Mode: engine.ModeExact, MaxSeqLen: 256, MTP: true}, engine.Params{}},
				{"exact sampled", engine.Options{Mode: engine.ModeExact, MaxSeqLen: 256}, engine.Params{Temperature: 0.8, TopP: 0.9, Seed: 7}},
				{"serving greedy mtp", engine.Options{Mode: engine.ModeServing, MaxSeqLen: 256, MTP: true}, engine.Params{}},
			} {
				a, err := cpu.New(hfCfg, hfW, tc.opts)
				if err != nil {
					t.Fatal(err)
				}
				b, err := cpu.New(cCfg, cw, tc.opts)
				if err != nil {
					t.Fatal(err)
				}
				ta, sa := run(t, a, prompt, tc.par, 24)
				tb, sb := run(t, b, prompt, tc.par, 24)
				if !slices.Equal(ta, tb) {
					t.Errorf("%s: converted generates %v, HF checkpoint %v", tc.name, tb, ta)
				}
				if len(sa) == 0 || !bytes.Equal(sa, sb) {
					t.Errorf("%s: prefill state differs (%d vs %d bytes)", tc.name, len(sb), len(sa))
				}
				if len(ta) < 24 {
					t.Errorf("%s: only %d tokens generated", tc.name, len(ta))
				}
			}
		})
	}
}
