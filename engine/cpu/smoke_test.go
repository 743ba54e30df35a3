package cpu

import (
	"slices"
	"testing"

	"github.com/tilert-go/tilert/engine"
	"github.com/tilert-go/tilert/engine/internal/enginetest"
)

// TestSmoke is the shortest end-to-end check of the CPU engine on each
// preset: greedy generation gives exactly max_tokens ids, all inside the
// vocabulary, the same ids when run again, and the same ids in a second
// slot.
func TestSmoke(t *testing.T) {
	for _, pr := range enginetest.Presets {
		t.Run(pr, func(t *testing.T) {
			e := newEngine(t, pr, engine.Options{Mode: engine.ModeExact, MaxSeqLen: 512, Slots: 2})
			vocab := e.Config().VocabSize
			prompt := enginetest.Prompt(20, vocab, 1)
			toks := enginetest.Generate(t, e, 0, prompt, engine.Params{}, 16)
			if len(toks) != 16 {
				t.Fatalf("%d tokens, want 16: %v", len(toks), toks)
			}
			if err := engine.CheckTokens(vocab, toks...); err != nil {
				t.Fatal(err)
			}
			if again := enginetest.Generate(t, e, 1, prompt, engine.Params{}, 16); !slices.Equal(again, toks) {
				t.Errorf("greedy output changed between runs/slots:\n%v\n%v", toks, again)
			}
		})
	}
}
