package benchcmd

import (
	"testing"

	"github.com/tilert-go/tilert/engine"
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
