package converter

import (
	"math"
	"slices"
	"testing"

	"github.com/tilert-go/tilert/model"
	"github.com/tilert-go/tilert/weights"
)

// sameWeights checks that every weight of cfg reads bit-identically from both sources.
func sameWeights(t *testing.T, cfg *model.Config, want, got model.Weights) {
	t.Helper()
	n := 0
	for _, s := range model.Specs(cfg) {
		a, err := want.Get(s.Name)
		if err != nil {
			t.Fatal(err)
		}
		b, err := got.Get(s.Name)
		if err != nil {
			t.Fatalf("converted: %+v", err)
		}
		if !slices.Equal(a.Shape, b.Shape) || len(a.Data) != len(b.Data) {
			t.Fatalf("%s: shape %v, want %v", s.Name, b.Shape, a.Shape)
		}
		for i := range a.Data {
			if math.Float32bits(a.Data[i]) != math.Float32bits(b.Data[i]) {
				t.Fatalf("%s[%d] = %v, want %v", s.Name, i, b.Data[i], a.Data[i])
			}
		}
		n++
	}
	t.Logf("%d tensors bit-identical", n)
}

func TestRoundTrip(t *testing.T) {
	for _, tc := range []struct {
		preset  string
		devices int
	}{
		{"deepseek-v3.2-tiny", 1},
		{"deepseek-v3.2-tiny", 3}, // 16 experts over 3 devices: 6, 5, 5
		{"glm-5-tiny", 1},
		{"glm-5-tiny", 2},
	} {
		t.Run(tc.preset+"/devices="+string(rune('0'+tc.devices)), func(t *testing.T) {
			src := presetDir(t, tc.preset)
			out, sum := convertTo(t, src, func(o *Options) { o.Devices = tc.devices })
			if sum.Shards < 2 || sum.Bytes <= 0 {
				t.Errorf("summary %+v: want several shards", sum)
			}
			if err := weights.Verify(out); err != nil {
				t.Fatalf("%+v", err)
			}
			hf, err := model.OpenHF(src)
			if err != nil {
				t.Fatal(err)
			}
			defer hf.Close()
			w, cfg, err := weights.OpenWeights(out)
			if err != nil {
				t.Fatalf("%+v", err)
			}
			defer w.(*weights.Dir).Close()
			if cfg.NumNextNLayers != hf.Config().NumNextNLayers || cfg.Family != hf.Config().Family {
				t.Errorf("config %+v", cfg)
			}
			sameWeights(t, hf.Config(), hf, w)
		})
	}
}
