package benchcmd

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/cockroachdb/errors"
	"github.com/urfave/cli/v2"

	"github.com/tilert-go/tilert/cuda/cupti"
	"github.com/tilert-go/tilert/internal/cliutil"
)

// timeliner is the GPU engine's traced step (--timeline).
type timeliner interface {
	TimelineStep(ids []int, warm int) ([]cupti.KernelRecord, error)
}

// TimelineFile is what --timeline writes: one entry per (context, slots)
// row, each one decode step's kernels as the GPU ran them (CUPTI; the
// step's device work replayed as graphs) and their analysis.
type TimelineFile struct {
	Version string        `json:"version"`
	Model   string        `json:"model"`
	Weights string        `json:"weights"`
	CUPTI   string        `json:"cupti_library"`
	Rows    []TimelineRow `json:"rows"`
}

// TimelineRow is one row's traced step.
type TimelineRow struct {
	Context   int     `json:"context"`
	Slots     int     `json:"slots"`
	StepP50MS float64 `json:"step_p50_ms"`
	// LayerMark is the kernel the layers were cut at: the first of the
	// names that run exactly once per layer (empty: none does).
	LayerMark string               `json:"layer_mark,omitempty"`
	Analysis  *cupti.Timeline      `json:"analysis"`
	Kernels   []cupti.KernelRecord `json:"kernels"`
}

// checkTimeline refuses --timeline where it cannot run, before anything
// loads.
func checkTimeline(c *cli.Context) error {
	if c.String("timeline") == "" {
		return nil
	}
	switch {
	case c.String("context") == "":
		return cliutil.WithExitCode(errors.WithHint(errors.New("--timeline needs --context"),
			"e.g. bench decode --context 8192 --slots 4 --timeline step.json"), cliutil.ExitUsage)
	case c.String("device") == "cpu":
		return cliutil.WithExitCode(errors.WithHint(errors.New("--timeline traces GPU kernels; --device cpu has none"),
			"run with --device cuda"), cliutil.ExitUsage)
	case c.Bool("profile"):
		return cliutil.WithExitCode(errors.WithHint(errors.New("--timeline and --profile each re-run a step at the end of a row"),
			"run them in two benches"), cliutil.ExitUsage)
	}
	pl, err := placement(c)
	if err != nil {
		return err
	}
	if len(pl.Devices) > 1 {
		return cliutil.WithExitCode(errors.WithHint(errors.New("--timeline traces the unsharded GPU engine"),
			"drop --devices"), cliutil.ExitUsage)
	}
	return nil
}

// traceAfter is the number of timed steps after which --timeline traces
// one: the profile's point (three tokens left) without MTP; with MTP, where
// a step gives a slot up to two tokens, early enough that no slot can have
// run out of tokens for the traced step.
func traceAfter(ntok int, mtp bool) int {
	if mtp {
		return max(1, (ntok-4)/2)
	}
	return ntok - 3
}

// traceRow traces one step of ids and analyses it.
func traceRow(tl timeliner, ids []int, context int, layers ...int) (TimelineRow, error) {
	recs, err := tl.TimelineStep(ids, 2)
	if err != nil {
		return TimelineRow{}, errors.Wrapf(err, "--timeline at context %d, %d slots", context, len(ids))
	}
	return analyseRow(recs, context, len(ids), layers...)
}

func analyseRow(recs []cupti.KernelRecord, context, slots int, layers ...int) (TimelineRow, error) {
	mark := layerMark(recs, layers...)
	a, err := cupti.Analyze(recs, cupti.Options{Gaps: 5, LayerMark: mark})
	if err != nil {
		return TimelineRow{}, err
	}
	return TimelineRow{Context: context, Slots: slots, LayerMark: mark, Kernels: recs, Analysis: a}, nil
}

// layerMark picks the kernel that opens each layer: of the names that run
// exactly once per layer (as many times as one of layers says: the main
// layers, with MTP also those plus the MTP layer), the one that first runs
// earliest in the step ("" when none does; counts under two are no layers).
func layerMark(recs []cupti.KernelRecord, layers ...int) string {
	count := map[string]int{}
	first := map[string]uint64{}
	for _, r := range recs {
		if f, ok := first[r.Name]; !ok || r.Start < f {
			first[r.Name] = r.Start
		}
		count[r.Name]++
	}
	mark := ""
	for name, n := range count {
		if slices.ContainsFunc(layers, func(l int) bool { return l >= 2 && n == l }) &&
			(mark == "" || first[name] < first[mark] || first[name] == first[mark] && name < mark) {
			mark = name
		}
	}
	return mark
}

// reportTimeline prints a row's traced step under the row.
func reportTimeline(w io.Writer, r TimelineRow) {
	a := r.Analysis
	us := func(ns uint64) float64 { return float64(ns) / 1e3 }
	busyPct := 0.0
	if a.SpanNs > 0 {
		busyPct = 100 * float64(a.BusyNs) / float64(a.SpanNs)
	}
	fmt.Fprintf(w, "  timeline (CUPTI, the step replayed as graphs): %d kernels, span %.1f us, busy %.1f us (%.0f%%), idle %.1f us in %d gaps; kernel time %.1f us, at most %d at once, streams %v\n",
		a.Kernels, us(a.SpanNs), us(a.BusyNs), busyPct, us(a.IdleNs), a.IdleGaps, us(a.SumNs), a.MaxConcurrent, a.Streams)
	names := func(ns []cupti.NameStat, most int) {
		for _, n := range ns[:min(len(ns), most)] {
			fmt.Fprintf(w, "    %-40s %4d runs %9.1f us (mean %7.2f) %5.1f%% of span\n", clip(n.Name, 40), n.Count, us(n.TotalNs), n.MeanNs/1e3, 100*n.Share)
		}
	}
	fmt.Fprintf(w, "    time start to end by name (a kernel launched early, PDL, counts its wait):\n")
	names(a.Names, 8)
	fmt.Fprintf(w, "    time charged at completion by name (the span split at kernel ends, to the kernel ending; %.1f us uncharged):\n", us(a.UnchargedNs))
	names(a.Charged, 12)
	for _, g := range a.Gaps {
		fmt.Fprintf(w, "    idle %7.2f us at +%.1f us: after %s, before %s\n", us(g.Ns), us(g.AtNs), clip(g.Before, 40), clip(g.After, 40))
	}
	if n := len(a.Layers); n > 0 {
		var span, busy uint64
		for _, l := range a.Layers {
			span, busy = span+l.SpanNs, busy+l.BusyNs
		}
		fmt.Fprintf(w, "    %d layers (each from %s): mean %.1f us, busy %.1f us; %.1f us before the first\n",
			n, clip(r.LayerMark, 40), us(span)/float64(n), us(busy)/float64(n), us(a.LeadNs))
	}
	if m := a.MedianLayer; m != nil {
		fmt.Fprintf(w, "    layer %d of 0-%d as it ran (median span of the %d between the first and the last): %.1f us; in end order, us from its start:\n",
			m.Index, len(a.Layers)-1, len(a.Layers)-2, us(m.SpanNs))
		fmt.Fprintf(w, "    %8s %8s %8s %8s %6s %-14s %s\n", "start", "end", "ran", "charged", "stream", "grid", "name")
		for _, k := range m.Kernels {
			fmt.Fprintf(w, "    %8.1f %8.1f %8.1f %8.1f %6d %-14s %s\n", us(k.StartNs), us(k.EndNs), us(k.Ns), us(k.ChargedNs), k.Stream,
				fmt.Sprintf("%dx%dx%d", k.Grid[0], k.Grid[1], k.Grid[2]), k.Name)
		}
		reportBlocks(w, m)
	}
}

// reportBlocks lists the median layer's block clocks (TILERT_GPU_BLOCK_CLOCKS=1),
// if any, in the same order.
func reportBlocks(w io.Writer, m *cupti.LayerRun) {
	if !slices.ContainsFunc(m.Kernels, func(k cupti.LayerKernel) bool { return k.Blocks != nil }) {
		return
	}
	fmt.Fprintf(w, "    its blocks (block clocks), us from the layer's start: in = resident, released = past the PDL wait, out = exit; run = release to exit:\n")
	fmt.Fprintf(w, "    %8s %8s %8s %8s %8s %8s %8s %5s %6s %s\n", "in", "all in", "released", "all rel", "out", "all out", "run p50", "SMs", "blocks", "name")
	ns := func(v int64) float64 { return float64(v) / 1000 }
	for _, k := range m.Kernels {
		if b := k.Blocks; b != nil {
			fmt.Fprintf(w, "    %8.1f %8.1f %8.1f %8.1f %8.1f %8.1f %8.1f %5d %6d %s\n", ns(b.FirstIn), ns(b.LastIn), ns(b.FirstReleased),
				ns(b.LastReleased), ns(b.FirstOut), ns(b.LastOut), ns(b.RunP50Ns), b.SMs, b.Blocks, k.Name)
			if len(b.Marks) > 0 {
				fmt.Fprintf(w, "        marks, us after release (the median block): %s\n", joinMarks(len(b.Marks), func(i int) (string, int64) {
					return b.Marks[i].Label, b.Marks[i].P50Ns
				}))
			}
			for _, e := range b.Each {
				var ms string
				if len(e.Marks) > 0 {
					ms = "; marks " + joinMarks(len(e.Marks), func(i int) (string, int64) { return e.Marks[i].Label, e.Marks[i].Ns })
				}
				fmt.Fprintf(w, "        block %d (SM %d): in %.1f, released %.1f, out %.1f, ran %.1f%s\n", e.Block, e.SM, ns(e.In), ns(e.Released), ns(e.Out), ns(e.Out-e.Released), ms)
			}
		}
	}
}

// joinMarks writes n marks (label, ns from release) as "label +us, ..".
func joinMarks(n int, at func(i int) (string, int64)) string {
	parts := make([]string, n)
	for i := range parts {
		l, ns := at(i)
		parts[i] = fmt.Sprintf("%s +%.1f", l, float64(ns)/1000)
	}
	return strings.Join(parts, ", ")
}

func clip(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n-3] + "..."
}

// writeTimeline writes f to path through a temporary file in the same
// folder, so a failed run leaves no half-written file.
func writeTimeline(path string, f TimelineFile) error {
	b, err := json.MarshalIndent(f, "", "  ")
	if err != nil {
		return errors.Wrap(err, "--timeline: encoding")
	}
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*")
	if err != nil {
		return errors.Wrapf(err, "--timeline: writing %s", path)
	}
	_, err = tmp.Write(append(b, '\n'))
	err = errors.CombineErrors(err, tmp.Close())
	if err == nil {
		err = os.Rename(tmp.Name(), path)
	}
	if err != nil {
		_ = os.Remove(tmp.Name())
		return errors.Wrapf(err, "--timeline: writing %s", path)
	}
	return nil
}
