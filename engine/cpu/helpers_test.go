package cpu

import (
	"os"
	"sync"
	"testing"

	"github.com/tilert-go/tilert/engine"
	"github.com/tilert-go/tilert/engine/internal/enginetest"
	"github.com/tilert-go/tilert/model"
)

func TestMain(m *testing.M) {
	code := m.Run()
	enginetest.RemovePresets()
	os.Exit(code)
}

type loaded struct {
	cfg *model.Config
	w   model.Weights
}

var loadedModels sync.Map

func loadPreset(t testing.TB, name string) loaded {
	t.Helper()
	if v, ok := loadedModels.Load(name); ok {
		return v.(loaded)
	}
	dir := enginetest.PresetDir(t, name)
	cfg, err := model.LoadConfig(dir)
	if err != nil {
		t.Fatal(err)
	}
	w, err := model.OpenWeights(dir)
	if err != nil {
		t.Fatal(err)
	}
	l := loaded{cfg: cfg, w: w}
	loadedModels.Store(name, l)
	return l
}

func newEngine(t testing.TB, preset string, opts engine.Options) *Engine {
	t.Helper()
	l := loadPreset(t, preset)
	e, err := New(l.cfg, l.w, opts)
	if err != nil {
		t.Fatal(err)
	}
	return e
}
