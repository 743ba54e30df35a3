package gpu

import (
	"fmt"
	"math"
	"os"
	"sort"
	"strings"
	"sync"
	"testing"
	"text/tabwriter"

	"github.com/tilert-go/tilert/cuda"
	"github.com/tilert-go/tilert/cuda/cudatest"
	"github.com/tilert-go/tilert/engine"
	"github.com/tilert-go/tilert/engine/cpu"
	"github.com/tilert-go/tilert/engine/internal/enginetest"
	"github.com/tilert-go/tilert/model"
)

var (
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
	if err := cudatest.Close(); err != nil {
		fmt.Fprintf(os.Stderr, "closing the device: %+v\n", err)
		code = 1
	}
	writeReport()
	enginetest.RemovePresets()
	os.Exit(code)
}

// gpuDevice is GPU 0 (cuda/cudatest), or skips the test without one.
func gpuDevice(t testing.TB) *cuda.Device {
	t.Helper()
	return cudatest.Device(t)
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

// generateBatch decodes several slots together (one Step over all active
// slots) with the same params and returns each slot's tokens.
func generateBatch(t testing.TB, e engine.Engine, prompts [][]int, p engine.Params, n int) [][]int {
	t.Helper()
	p.MaxTokens = n
	params := make([]engine.Params, len(prompts))
	for i := range params {
		params[i] = p
	}
	return enginetest.Batch(t, e, prompts, params)
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
