package cpu

import (
	"testing"

	"github.com/tilert-go/tilert/engine"
	"github.com/tilert-go/tilert/engine/internal/enginetest"
)

func TestSmoke(t *testing.T) {
	for _, pr := range enginetest.Presets {
		e := newEngine(t, pr, engine.Options{Mode: engine.ModeExact, MaxSeqLen: 512})
		toks := enginetest.Generate(t, e, 0, enginetest.Prompt(20, 1000, 1), engine.Params{}, 16)
		t.Logf("%s: %v", pr, toks)
	}
}
