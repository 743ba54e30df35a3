package benchcmd

import (
	"io"
	"strings"
	"testing"

	"github.com/urfave/cli/v2"

	"github.com/tilert-go/tilert/engine"
	"github.com/tilert-go/tilert/engine/gpu"
	"github.com/tilert-go/tilert/internal/engineload"
)

// The floor of the deepseek-v3.2-moe dimensions (1 dense + 1 MoE layer)
// is the checkpoint sum engine/gpu/NOTES.md derived by hand: 3053 MB with
// 8 routed experts, and 4 slots read more experts but not 4x.
func TestWeightFloorBytes(t *testing.T) {
	cfg, err := engineload.DummyConfig("deepseek-v3.2", 1)
	if err != nil {
		t.Fatal(err)
	}
	one := weightFloorBytes(cfg, 1)
	if one < 3.04e9 || one > 3.07e9 {
		t.Errorf("1 slot: %d bytes, want ~3.053e9", one)
	}
	four := weightFloorBytes(cfg, 4)
	if four <= one || four > one+4*352_400_000 {
		t.Errorf("4 slots: %d bytes (1 slot %d)", four, one)
	}
	// --same-rows: four copies of one row read one row's experts and
	// embedding row; an MTP step's two rows a slot count as one slot's two.
	if same := weightFloorBytesMTP(cfg, 4, 0, 4); same != one {
		t.Errorf("4 same rows: %d bytes, want 1 slot's %d", same, one)
	}
	if same, two := weightFloorBytesMTP(cfg, 8, 4, 4), weightFloorBytesMTP(cfg, 2, 1, 1); same != two {
		t.Errorf("4 same MTP slots: %d bytes, want 1 slot's %d", same, two)
	}
	glm, err := engineload.DummyConfig("glm-5", 8)
	if err != nil {
		t.Fatal(err)
	}
	if glm.NumLayers != 11 || glm.HiddenSize != 6144 || glm.NumHeads != 64 {
		t.Errorf("glm-5 dummy: %d layers, hidden %d, %d heads", glm.NumLayers, glm.HiddenSize, glm.NumHeads)
	}
	lay, err := engine.NewLayout(engine.CacheFP8DSMLA, 512, 64, 128, 4096, []bool{true, true})
	if err != nil {
		t.Fatal(err)
	}
	// 2 layers at C = 4096: 2048 selected MLA entries and 4096 indexer keys each.
	if got, want := cacheFloorBytes(cfg, lay, 4096), int64(2*(2048*656+4096*132)); got != want {
		t.Errorf("cache floor %d, want %d", got, want)
	}
	if _, err := engineload.DummyConfig("nope", 1); err == nil {
		t.Error("unknown dummy model accepted")
	}
}

// An MTP step reads the main layers for two rows a slot (more distinct
// experts than one row, fewer than twice) plus the MTP layer for one.
func TestWeightFloorBytesMTP(t *testing.T) {
	cfg, err := engineload.DummyConfigMTP("deepseek-v3.2", 1, true)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.NumNextNLayers != 1 {
		t.Fatalf("deepseek-v3.2 dummy: %d MTP layers", cfg.NumNextNLayers)
	}
	one, two := weightFloorBytes(cfg, 1), weightFloorBytesMTP(cfg, 2, 0, 1)
	if weightFloorBytesMTP(cfg, 1, 0, 1) != one || two <= one || two >= 2*one {
		t.Errorf("main layers: 1 row %d, 2 rows %d", one, two)
	}
	// The MTP layer is an MoE layer (8 routed experts and the shared one
	// at 44 MB, attention ~0.2 GB), its eh_proj, and its own bf16 head
	// (1.85 GB); one row of its embedding.
	mtp := weightFloorBytesMTP(cfg, 2, 1, 1) - two
	if mtp < 2_400_000_000 || mtp > 2_800_000_000 {
		t.Errorf("MTP layer adds %d bytes", mtp)
	}
	lay, err := engine.NewLayout(engine.CacheFP8DSMLA, 512, 64, 128, 4096, []bool{true, true, true})
	if err != nil {
		t.Fatal(err)
	}
	// 2 main layers x 2 rows + the MTP layer x 1 row of 2048 selected
	// entries; the keys of 3 indexers once.
	if got, want := cacheFloorBytesMTP(cfg, lay, 4096, true), int64(5*2048*656+3*4096*132); got != want {
		t.Errorf("MTP cache floor %d, want %d", got, want)
	}
}

func TestParseContexts(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want int
		ok   bool
	}{{"1024,8192", 2, true}, {"1024", 1, true}, {"1024,x", 0, false}, {"0", 0, false}, {"", 0, false}} {
		got, err := parseContexts(tc.in)
		if (err == nil) != tc.ok || len(got) != tc.want {
			t.Errorf("%q: %v %v", tc.in, got, err)
		}
	}
}

// Rank 0's floor of a TP-8 DeepSeek-V3.2 step (1 dense + 4 MoE layers): its
// 16 heads, 1/8 of every expert and of the vocabulary, the rest whole: the
// 0.75 GB the H200 run printed (docs/measured/h200-2026-12-01-tp), well
// under the whole step's 4.86 GB and above an eighth of it.
func TestRankFloorBytes(t *testing.T) {
	cfg, err := engineload.DummyConfig("deepseek-v3.2", 4)
	if err != nil {
		t.Fatal(err)
	}
	whole := weightFloorBytes(cfg, 1)
	rc := sliceConfig(cfg, [2]int{0, 16}, [2]int{0, cfg.IntermediateSize / 8}, [2]int{0, cfg.MoEIntermediateSize / 8}, [2]int{0, cfg.VocabSize / 8})
	rank := weightFloorBytes(rc, 1)
	if rank < 700_000_000 || rank > 800_000_000 || rank <= whole/8 || rank >= whole/4 {
		t.Errorf("rank 0 floor %d bytes, whole step %d", rank, whole)
	}
	if rc.NumHeads != 16 || rc.VocabSize != cfg.VocabSize/8 || cfg.NumHeads != 128 {
		t.Errorf("slice: %d heads, vocab %d (whole config changed: %d heads)", rc.NumHeads, rc.VocabSize, cfg.NumHeads)
	}
}

func TestPlacementRefusals(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--devices", "0,x"}, "--devices"},
		{[]string{"--devices", "0,1", "--comm", "ring"}, "unknown communicator"},
	} {
		app := &cli.App{Commands: []*cli.Command{Command()}, Writer: io.Discard, ErrWriter: io.Discard, ExitErrHandler: func(*cli.Context, error) {}}
		args := append([]string{"tilert", "bench", "decode", "--dummy-weights", "deepseek-v3.2", "--context", "1024"}, tc.args...)
		err := app.Run(args)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: err = %v, want one containing %q", tc.args, err, tc.want)
		}
	}
}

// --one-expert-bank is a dummy-weights, one-GPU switch: elsewhere it is
// refused before any engine is built, naming what to change.
func TestOneExpertBankRefusals(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--model-dir", "/nonexistent", "--context", "1024", "--one-expert-bank"}, "--one-expert-bank needs --dummy-weights"},
		{[]string{"--model-dir", "/nonexistent", "--one-expert-bank"}, "--one-expert-bank needs --dummy-weights"},
		{[]string{"--dummy-weights", "deepseek-v3.2", "--layers", "1", "--context", "1024", "--devices", "0,1", "--one-expert-bank"}, "the sharded engine keeps a bank a layer"},
	} {
		app := &cli.App{Commands: []*cli.Command{Command()}, Writer: io.Discard, ErrWriter: io.Discard, ExitErrHandler: func(*cli.Context, error) {}}
		err := app.Run(append([]string{"tilert", "bench", "decode"}, tc.args...))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: err = %v, want one containing %q", tc.args, err, tc.want)
		}
	}
}

// The floor on a probed step's touched experts: the routing of 4 rows that
// all hit the same 8 experts reads what --same-rows' floor counts; 4 rows
// of 32 distinct experts more than uniform routing's expectation; a layer
// seen twice in a step counts its experts once.
func TestTouchedFloor(t *testing.T) {
	cfg, err := engineload.DummyConfig("deepseek-v3.2", 3)
	if err != nil {
		t.Fatal(err)
	}
	K := cfg.NumExpertsPerTok
	var moe []int
	for l := range cfg.NumLayers {
		if cfg.IsMoELayer(l) {
			moe = append(moe, l)
		}
	}
	route := func(distinct bool) []gpu.RoutedLayer {
		var out []gpu.RoutedLayer
		for _, l := range moe {
			ids := make([]int32, 4*K)
			for i := range ids {
				ids[i] = int32(i % K)
				if distinct {
					ids[i] = int32(i)
				}
			}
			// The same layer's routing in two parts (rows 0-1, 2-3).
			out = append(out, gpu.RoutedLayer{Layer: l, Rows: 2, IDs: ids[:2*K]}, gpu.RoutedLayer{Layer: l, Rows: 2, IDs: ids[2*K:]})
		}
		return out
	}
	same := touchedExperts(route(false))
	for _, l := range moe {
		if same[l] != K {
			t.Fatalf("layer %d: %d touched experts, want %d", l, same[l], K)
		}
	}
	var row ContextRow
	row.StepP50MS = 1
	touchedFloor(&row, cfg, same, 4, 0, 4, 3000) // --same-rows: 4 copies of a row
	if want := weightFloorBytesMTP(cfg, 4, 0, 4); row.TouchedFloorBytes != want {
		t.Errorf("4 rows on the same experts: touched floor %d, want --same-rows' %d", row.TouchedFloorBytes, want)
	}
	if row.TouchedExperts != float64(K) || row.UniformExperts != float64(K) || row.TouchedEfficiency <= 0 {
		t.Errorf("touched %.1f experts (uniform %.1f), efficiency %.3f", row.TouchedExperts, row.UniformExperts, row.TouchedEfficiency)
	}
	var rowD ContextRow
	touchedFloor(&rowD, cfg, touchedExperts(route(true)), 4, 0, 1, 3000)
	if uni := weightFloorBytes(cfg, 4); rowD.TouchedFloorBytes <= uni || rowD.TouchedExperts != float64(4*K) || rowD.UniformExperts <= float64(3*K) {
		t.Errorf("4 rows on 32 distinct experts: touched floor %d (%.0f experts), want above uniform routing's %d", rowD.TouchedFloorBytes, rowD.TouchedExperts, uni)
	}
}
