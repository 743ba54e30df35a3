package gpu

import (
	"fmt"
	"math"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"
	"text/tabwriter"

	"github.com/cockroachdb/errors"

	"github.com/tilert-go/tilert/cuda"
	"github.com/tilert-go/tilert/engine"
	"github.com/tilert-go/tilert/engine/cpu"
	"github.com/tilert-go/tilert/model"
	"github.com/tilert-go/tilert/model/synth"
)

var presets = []string{"deepseek-v3.2-tiny", "glm-5-tiny"}

var presetRoot = func() string {
	d, err := os.MkdirTemp("", "tilert-gpu-engine-test-")
	if err != nil {
		panic(err)
	}
	return d
}()

var (
	devOnce sync.Once
	testDev *cuda.Device
	devErr  error

	reportMu   sync.Mutex
	reportRows []reportRow
)

type reportRow struct {
	name, metric string
	value, bound float64
	pass         bool
}

func TestMain(m *testing.M) {
	code := m.Run()
	if testDev != nil {
		if err := testDev.Close(); err != nil {
			fmt.Fprintf(os.Stderr, "closing the device: %+v\n", err)
			code = 1
		}
	}
	writeReport()
	os.RemoveAll(presetRoot)
	os.Exit(code)
}

// gpuDevice opens GPU 0 once, or skips the test without one.
func gpuDevice(t testing.TB) *cuda.Device {
	t.Helper()
	devOnce.Do(func() { testDev, devErr = cuda.Open(0) })
	if devErr != nil {
		if errors.Is(devErr, cuda.ErrNoGPU) {
			t.Skipf("no GPU here, GPU engine test skipped (run scripts/gpu-check.sh on a GPU machine): %v", devErr)
		}
		t.Fatalf("opening GPU 0: %+v", devErr)
	}
	return testDev
}

// record adds a row to the model check table (TILERT_ENGINE_REPORT) and
// fails the test when value exceeds bound.
func record(t *testing.T, name, metric string, value, bound float64) {
	t.Helper()
	pass := value <= bound && !math.IsNaN(value)
	reportMu.Lock()
	reportRows = append(reportRows, reportRow{name, metric, value, bound, pass})
	reportMu.Unlock()
	if !pass {
		t.Errorf("%s: %s = %.3g, bound %.3g", name, metric, value, bound)
	} else {
		t.Logf("%s: %s = %.3g (bound %.3g)", name, metric, value, bound)
	}
}

func writeReport() {
	reportMu.Lock()
	defer reportMu.Unlock()
	if len(reportRows) == 0 {
		return
	}
	var b strings.Builder
	tw := tabwriter.NewWriter(&b, 2, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "model check\tmetric\tvalue\tbound\tresult")
	for _, r := range reportRows {
		res := "PASS"
		if !r.pass {
			res = "FAIL"
		}
		fmt.Fprintf(tw, "%s\t%s\t%.3g\t%.3g\t%s\n", r.name, r.metric, r.value, r.bound, res)
	}
	_ = tw.Flush()
	fmt.Print("\n" + b.String())
	if p := os.Getenv("TILERT_ENGINE_REPORT"); p != "" {
		if err := os.WriteFile(p, []byte(b.String()), 0o644); err != nil {
			fmt.Fprintf(os.Stderr, "report: %v\n", err)
		}
	}
}

var presetDirs sync.Map

// presetDir writes a preset's synthetic checkpoint (seed 0) once per run.
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

func hfSourceOf(t testing.TB, dir string) (*model.HFWeights, Source) {
	t.Helper()
	w, err := model.OpenHF(dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { w.Close() })
	return w, FromHF(w)
}

// backendKind builds engines on the emulator or the GPU.
type deviceKind string

const (
	onEmu deviceKind = "emu"
	onGPU deviceKind = "gpu"
)

func newTestEngine(t testing.TB, kind deviceKind, src Source, opts engine.Options) *Engine {
	t.Helper()
	var e *Engine
	var err error
	if kind == onGPU {
		e, err = NewOnDevice(gpuDevice(t), src, opts)
	} else {
		e, err = NewEmulated(src, opts)
	}
	if err != nil {
		t.Fatalf("%s engine: %+v", kind, err)
	}
	t.Cleanup(func() {
		if err := e.Close(); err != nil {
			t.Errorf("close: %+v", err)
		}
	})
	return e
}

func newCPU(t testing.TB, w *model.HFWeights, opts engine.Options) *cpu.Engine {
	t.Helper()
	opts.Mode = engine.ModeServing
	e, err := cpu.New(w.Config(), w, opts)
	if err != nil {
		t.Fatal(err)
	}
	return e
}

// generate runs prefill + decode in one slot and returns every generated
// token (the first included).
func generate(t testing.TB, e engine.Engine, slot int, prompt []int, p engine.Params, n int) []int {
	t.Helper()
	first, err := e.Prefill(slot, prompt, p)
	if err != nil {
		t.Fatalf("prefill: %+v", err)
	}
	return decodeFrom(t, e, slot, first, p, n)
}

func decodeFrom(t testing.TB, e engine.Engine, slot, first int, p engine.Params, n int) []int {
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
	e.Release(slot)
	return out
}

// generateBatch decodes several slots together (one Step over all active
// slots) and returns each slot's tokens.
func generateBatch(t testing.TB, e engine.Engine, prompts [][]int, p engine.Params, n int) [][]int {
	t.Helper()
	out := make([][]int, len(prompts))
	var active []int
	p.MaxTokens = n
	for i, pr := range prompts {
		first, err := e.Prefill(i, pr, p)
		if err != nil {
			t.Fatalf("prefill %d: %+v", i, err)
		}
		out[i] = []int{first}
		fin, err := e.Start(i, first, p)
		if err != nil {
			t.Fatal(err)
		}
		if fin == engine.FinishNone {
			active = append(active, i)
		}
	}
	for len(active) > 0 {
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
	for i := range prompts {
		e.Release(i)
	}
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

// firstDiff is the index of the first differing token, -1 when equal.
func firstDiff(a, b []int) int {
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

// relErr is max|a-b| / max|b| over one logits row.
func relErr(a, b []float32) float64 {
	var num, den float64
	for i := range b {
		num = math.Max(num, math.Abs(float64(a[i])-float64(b[i])))
		den = math.Max(den, math.Abs(float64(b[i])))
	}
	if den == 0 {
		return num
	}
	return num / den
}

func argmax(x []float32) int { return engine.Argmax(x) }

func median(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	s := append([]float64(nil), v...)
	sort.Float64s(s)
	return s[len(s)/2]
}
