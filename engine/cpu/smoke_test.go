package cpu

import (
	"testing"

	"github.com/tilert-go/tilert/engine"
)

func TestSmoke(t *testing.T) {
	for _, pr := range presets {
		e := newEngine(t, pr, engine.Options{Mode: engine.ModeExact, MaxSeqLen: 512})
		toks := generate(t, e, 0, testPrompt(20, 1000, 1), engine.Params{}, 16)
		t.Logf("%s: %v", pr, toks)
	}
}
