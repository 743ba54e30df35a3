// Package enginetest holds the helpers the engine backends' tests share
// (engine/cpu, engine/gpu, and the next backend): deterministic prompts,
// driving an engine.Engine through prefill, start and steps, one slot or
// a batch, and the HF goldens. Test code only.
package enginetest

import (
	"os"
	"path/filepath"
	"sync"
	"testing"

	"github.com/tilert-go/tilert/engine"
	"github.com/tilert-go/tilert/engine/internal/golden"
	"github.com/tilert-go/tilert/model/synth"
)

// Presets are the tiny synthetic models every backend is checked on.
var Presets = []string{"deepseek-v3.2-tiny", "glm-5-tiny"}

// Prompt is a deterministic pseudo-random prompt of n token ids < vocab.
func Prompt(n, vocab int, seed int) []int {
	p := make([]int, n)
	x := uint32(seed*7919 + 17)
	for i := range p {
		x = x*1664525 + 1013904223
		p[i] = int(x>>8) % vocab
	}
	return p
}

// Generate runs prefill and decode in one slot and returns every generated
// token (the first included); the slot is released.
func Generate(t testing.TB, e engine.Engine, slot int, prompt []int, p engine.Params, n int) []int {
	t.Helper()
	out := GenerateKeep(t, e, slot, prompt, p, n)
	e.Release(slot)
	return out
}

// GenerateKeep is Generate leaving the slot finished, not released (its
// state can still be exported).
func GenerateKeep(t testing.TB, e engine.Engine, slot int, prompt []int, p engine.Params, n int) []int {
	t.Helper()
	first, err := e.Prefill(slot, prompt, p)
	if err != nil {
		t.Fatalf("prefill: %+v", err)
	}
	return decode(t, e, slot, first, p, n)
}

// DecodeFrom starts a loaded slot at first and steps it to its end,
// returning every generated token (first included); the slot is released.
func DecodeFrom(t testing.TB, e engine.Engine, slot, first int, p engine.Params, n int) []int {
	t.Helper()
	out := decode(t, e, slot, first, p, n)
	e.Release(slot)
	return out
}

func decode(t testing.TB, e engine.Engine, slot, first int, p engine.Params, n int) []int {
	t.Helper()
	out := []int{first}
	p.MaxTokens = n
	fin, err := e.Start(slot, first, p)
	if err != nil {
		t.Fatalf("start: %+v", err)
	}
	for fin == engine.FinishNone {
		res, err := e.Step([]int{slot})
		if err != nil {
			t.Fatalf("step: %+v", err)
		}
		out = append(out, res[0].Tokens...)
		fin = res[0].Finish
	}
	return out
}

// Batch prefills prompts[i] into slot i with params[i] (MaxTokens set by
// the caller), then steps every active slot together until all finish, and
// returns each slot's tokens; the slots are released.
func Batch(t testing.TB, e engine.Engine, prompts [][]int, params []engine.Params) [][]int {
	t.Helper()
	return BatchHook(t, e, prompts, params, nil)
}

// BatchHook is Batch calling before (when set) ahead of every step with the
// active slots and the tokens so far.
func BatchHook(t testing.TB, e engine.Engine, prompts [][]int, params []engine.Params, before func(active []int, out [][]int)) [][]int {
	t.Helper()
	out := BatchKeep(t, e, prompts, params, before)
	for i := range prompts {
		e.Release(i)
	}
	return out
}

// BatchKeep is BatchHook leaving the slots held (their caches can be
// exported); the caller releases them.
func BatchKeep(t testing.TB, e engine.Engine, prompts [][]int, params []engine.Params, before func(active []int, out [][]int)) [][]int {
	t.Helper()
	out := make([][]int, len(prompts))
	var active []int
	for i, pr := range prompts {
		first, err := e.Prefill(i, pr, params[i])
		if err != nil {
			t.Fatalf("prefill %d: %+v", i, err)
		}
		out[i] = []int{first}
		fin, err := e.Start(i, first, params[i])
		if err != nil {
			t.Fatalf("start %d: %+v", i, err)
		}
		if fin == engine.FinishNone {
			active = append(active, i)
		}
	}
	for len(active) > 0 {
		if before != nil {
			before(active, out)
		}
		res, err := e.Step(active)
		if err != nil {
			t.Fatalf("step: %+v", err)
		}
		var next []int
		for _, r := range res {
			out[r.Slot] = append(out[r.Slot], r.Tokens...)
			if r.Finish == engine.FinishNone {
				next = append(next, r.Slot)
			}
		}
		active = next
	}
	return out
}

// FirstDiff is the index of the first differing token, -1 when equal.
func FirstDiff(a, b []int) int {
	for i := 0; i < min(len(a), len(b)); i++ {
		if a[i] != b[i] {
			return i
		}
	}
	if len(a) != len(b) {
		return min(len(a), len(b))
	}
	return -1
}

// Goldens reads testdata/golden/*.json, skipping the test when there is none.
func Goldens(t *testing.T) []*golden.File {
	gs, err := golden.Load()
	if err != nil {
		t.Fatal(err)
	}
	if len(gs) == 0 {
		t.Skip("no testdata/golden/*.json yet: generate them with scripts/golden_all.sh on an H200")
	}
	return gs
}

var (
	presetMu   sync.Mutex
	presetRoot string
	presetDirs = map[string]string{}
)

// PresetDir writes a preset's synthetic checkpoint (seed 0) once per test
// run into a temporary folder; a TestMain removes it with RemovePresets. A
// trained model's name (testdata/models/<name>) gives its committed
// checkpoint.
func PresetDir(t testing.TB, name string) string {
	t.Helper()
	if d, err := golden.TrainedModelDir(name); err != nil {
		t.Fatal(err)
	} else if d != "" {
		return d
	}
	presetMu.Lock()
	defer presetMu.Unlock()
	if d, ok := presetDirs[name]; ok {
		return d
	}
	if presetRoot == "" {
		d, err := os.MkdirTemp("", "tilert-engine-test-")
		if err != nil {
			t.Fatal(err)
		}
		presetRoot = d
	}
	dir := filepath.Join(presetRoot, name)
	if err := synth.Write(name, dir, 0, nil); err != nil {
		t.Fatalf("synth %s: %v", name, err)
	}
	presetDirs[name] = dir
	return dir
}

// RemovePresets deletes what PresetDir wrote.
func RemovePresets() {
	presetMu.Lock()
	defer presetMu.Unlock()
	if presetRoot != "" {
		os.RemoveAll(presetRoot)
	}
	presetRoot, presetDirs = "", map[string]string{}
}

// GoldenDir is the checkpoint a golden was made from: a trained model's
// committed one (testdata/models/<preset>), or the synthetic preset at the
// golden's seed written into a temporary folder of the test.
func GoldenDir(t testing.TB, g *golden.File) string {
	t.Helper()
	dir, err := g.ModelDir()
	if err != nil {
		t.Fatal(err)
	}
	if dir == "" {
		dir = filepath.Join(t.TempDir(), g.Preset)
		if err := synth.Write(g.Preset, dir, g.Seed, nil); err != nil {
			t.Fatal(err)
		}
	}
	if err := g.CheckCheckpoint(dir); err != nil {
		t.Fatal(err)
	}
	return dir
}

// TrainedGoldens are the goldens of trained models (those with a
// teacher-forced text window), skipping the test when there is none.
func TrainedGoldens(t *testing.T) []*golden.File {
	var out []*golden.File
	for _, g := range Goldens(t) {
		if g.TeacherForced != nil {
			out = append(out, g)
		}
	}
	if len(out) == 0 {
		t.Skip("no trained model's golden in testdata/golden")
	}
	return out
}
