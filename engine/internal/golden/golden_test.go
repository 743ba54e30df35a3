package golden

import (
	"encoding/json"
	"testing"
)

func TestAmbiguousAndErr(t *testing.T) {
	var g File
	if err := json.Unmarshal([]byte(`{"preset":"p","cases":[{"name":"a"}],"diagnostics":[
		{"case":"a","topk":{"exact_ties":{"indexer":2}}},
		{"case":"b","crosscheck":{"single_forward_max_rel":0.5}},
		{"case":"c","crosscheck":{"single_forward_max_rel":1e-7}}]}`), &g); err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string]bool{"a": true, "b": true, "c": false, "missing": false} {
		if got := g.Ambiguous(name) != ""; got != want {
			t.Errorf("Ambiguous(%s) = %v, want %v", name, got, want)
		}
	}
	if e := RelErr([]float32{1, 2}, []float64{1, 4}); e != 0.5 {
		t.Errorf("RelErr = %v, want 0.5", e)
	}
	if i := Argmax([]float64{1, 3, 3, 2}); i != 1 {
		t.Errorf("Argmax = %d, want 1", i)
	}
}

func TestLoadRepoGoldens(t *testing.T) {
	gs, err := Load()
	if err != nil {
		t.Fatal(err)
	}
	for _, g := range gs {
		for _, c := range g.Cases {
			if len(c.GreedyIDs) == 0 || len(c.Logits) != len(c.GreedyIDs) {
				t.Errorf("%s/%s: %d greedy ids, %d logit rows", g.Preset, c.Name, len(c.GreedyIDs), len(c.Logits))
			}
		}
	}
}
