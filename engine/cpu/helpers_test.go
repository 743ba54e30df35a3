package cpu

import (
	"os"
	"path/filepath"
	"sync"
	"testing"

	"github.com/tilert-go/tilert/engine"
	"github.com/tilert-go/tilert/model"
	"github.com/tilert-go/tilert/model/synth"
)

var presetDirs sync.Map // preset name -> dir (shared by the tests of one run)

var presetRoot = func() string {
	d, err := os.MkdirTemp("", "tilert-engine-test-")
	if err != nil {
		panic(err)
	}
	return d
}()

func TestMain(m *testing.M) {
	code := m.Run()
	os.RemoveAll(presetRoot)
	os.Exit(code)
}

// presetDir writes the synthetic checkpoint of a preset once per test run.
func presetDir(t testing.TB, name string) string {
	t.Helper()
	if d, ok := presetDirs.Load(name); ok {
		return d.(string)
	}
	dir := filepath.Join(presetRoot, name)
	if err := synth.Write(name, dir, 0, nil); err != nil {
		t.Fatalf("synth %s: %v", name, err)
	}
	presetDirs.Store(name, dir)
	return dir
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
	dir := presetDir(t, name)
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

var presets = []string{"deepseek-v3.2-tiny", "glm-5-tiny"}

// generate runs prefill + greedy/sampled decode in one slot and returns all
// generated tokens (first included).
func generate(t testing.TB, e *Engine, slot int, prompt []int, p engine.Params, n int) []int {
	t.Helper()
	first, err := e.Prefill(slot, prompt, p)
	if err != nil {
		t.Fatal(err)
	}
	return decodeFrom(t, e, slot, first, p, n)
}

func decodeFrom(t testing.TB, e *Engine, slot, first int, p engine.Params, n int) []int {
	t.Helper()
	out := []int{first}
	p.MaxTokens = n
	fin, err := e.Start(slot, first, p)
	if err != nil {
		t.Fatal(err)
	}
	for fin == engine.FinishNone {
		res, err := e.Step([]int{slot})
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, res[0].Tokens...)
		fin = res[0].Finish
	}
	e.Release(slot)
	return out
}

func testPrompt(n, vocab int, seed int) []int {
	p := make([]int, n)
	x := uint32(seed*7919 + 17)
	for i := range p {
		x = x*1664525 + 1013904223
		p[i] = int(x>>8) % vocab
	}
	return p
}
