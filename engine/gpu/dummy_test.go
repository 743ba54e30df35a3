package gpu

import (
	"testing"

	"github.com/tilert-go/tilert/engine"
	"github.com/tilert-go/tilert/model/synth"
)

// Dummy weights fit every tensor the engine loads (shapes, FP8 experts,
// absorbed matrices, bf16 tables) and give finite logits: a prefill and a
// few steps run on the emulator for both families.
func TestDummySourceRuns(t *testing.T) {
	for _, name := range []string{"deepseek-v3.2-tiny", "glm-5-tiny"} {
		t.Run(name, func(t *testing.T) {
			p, err := synth.Lookup(name)
			if err != nil {
				t.Fatal(err)
			}
			b, err := synth.Build(p, 0)
			if err != nil {
				t.Fatal(err)
			}
			e, err := NewEmulated(Dummy(b.Config, 3), engine.Options{Mode: engine.ModeServing, Slots: 1, MaxSeqLen: 64})
			if err != nil {
				t.Fatal(err)
			}
			defer e.Close()
			first, err := e.Prefill(0, []int{5, 9, 200, 17}, engine.Params{MaxTokens: 4})
			if err != nil {
				t.Fatal(err)
			}
			if _, err := e.Start(0, first, engine.Params{MaxTokens: 4}); err != nil {
				t.Fatal(err)
			}
			res, err := e.Step([]int{0})
			if err != nil {
				t.Fatal(err)
			}
			if len(res) != 1 || len(res[0].Tokens) != 1 || res[0].Tokens[0] < 0 || res[0].Tokens[0] >= b.Config.VocabSize {
				t.Fatalf("step result %+v", res)
			}
		})
	}
}
