package converter

import (
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/tilert-go/tilert/model"
	"github.com/tilert-go/tilert/numeric"
	"github.com/tilert-go/tilert/safetensors"
	"github.com/tilert-go/tilert/weights"
)

// rewriteCheckpoint writes a single-file copy of src where fn may replace each tensor (returning
// nil drops it), and edits config.json with cfg.
func rewriteCheckpoint(t *testing.T, src string, fn func(c *safetensors.Checkpoint, t safetensors.Tensor) []safetensors.Tensor, cfg func(map[string]any)) string {
	t.Helper()
	ck, err := safetensors.OpenDir(src)
	if err != nil {
		t.Fatal(err)
	}
	defer ck.Close()
	var out []safetensors.Tensor
	for _, n := range ck.Names() {
		info, _, _ := ck.Lookup(n)
		data, err := ck.Data(n)
		if err != nil {
			t.Fatal(err)
		}
		info.Begin, info.End = 0, 0
		out = append(out, fn(ck, safetensors.Tensor{Info: info, Data: slices.Clone(data)})...)
	}
	dir := copyDir(t, src)
	ents, _ := os.ReadDir(dir)
	for _, e := range ents {
		if filepath.Ext(e.Name()) == ".safetensors" || e.Name() == safetensors.IndexFile {
			os.Remove(filepath.Join(dir, e.Name()))
		}
	}
	if err := safetensors.WriteFile(filepath.Join(dir, "model.safetensors"), out, map[string]string{"format": "pt"}); err != nil {
		t.Fatal(err)
	}
	if cfg != nil {
		editJSON(t, filepath.Join(dir, "config.json"), cfg)
	}
	return dir
}

func roundTrip(t *testing.T, src string, mod func(*Options)) *weights.Manifest {
	t.Helper()
	out, _ := convertTo(t, src, mod)
	if err := weights.Verify(out); err != nil {
		t.Fatalf("%+v", err)
	}
	hf, err := model.OpenHF(src)
	if err != nil {
		t.Fatal(err)
	}
	defer hf.Close()
	w, _, err := weights.OpenWeights(out)
	if err != nil {
		t.Fatal(err)
	}
	defer w.(*weights.Dir).Close()
	sameWeights(t, hf.Config(), hf, w)
	return w.(*weights.Dir).Manifest()
}

// TestBF16Scales: checkpoints whose weight_scale_inv are bf16 are widened to the float32 scale
// layout exactly; tiny chunks make every widening cross chunk boundaries.
func TestBF16Scales(t *testing.T) {
	src := rewriteCheckpoint(t, presetDir(t, "deepseek-v3.2-tiny"), func(_ *safetensors.Checkpoint, ts safetensors.Tensor) []safetensors.Tensor {
		if !model.IsScaleName(ts.Info.Name) {
			return []safetensors.Tensor{ts}
		}
		f := make([]float32, len(ts.Data)/4)
		numeric.DecodeF32(f, ts.Data)
		ts.Info.DType = safetensors.BF16
		ts.Data = make([]byte, 2*len(f))
		numeric.EncodeBF16(ts.Data, f)
		return []safetensors.Tensor{ts}
	}, nil)
	for _, chunk := range []int{4096, 4104, 1 << 20} {
		roundTrip(t, src, func(o *Options) { o.ChunkBytes = chunk })
	}
}

// TestUnquantised: a bf16 checkpoint (no quantization_config) converts with bf16 absorbed
// matrices and no scale tensors.
func TestUnquantised(t *testing.T) {
	src := rewriteCheckpoint(t, presetDir(t, "glm-5-tiny"), func(ck *safetensors.Checkpoint, ts safetensors.Tensor) []safetensors.Tensor {
		switch {
		case model.IsScaleName(ts.Info.Name):
			return nil
		case ts.Info.DType == safetensors.F8E4M3:
			sd, err := ck.Data(model.ScaleName(ts.Info.Name))
			if err != nil {
				t.Fatal(err)
			}
			s := make([]float32, len(sd)/4)
			numeric.DecodeF32(s, sd)
			r, c := int(ts.Info.Shape[0]), int(ts.Info.Shape[1])
			f := make([]float32, r*c)
			if err := numeric.DequantBlockFP8(f, ts.Data, s, r, c); err != nil {
				t.Fatal(err)
			}
			ts.Info.DType = safetensors.BF16
			ts.Data = make([]byte, 2*len(f))
			numeric.EncodeBF16(ts.Data, f)
		}
		return []safetensors.Tensor{ts}
	}, func(m map[string]any) { delete(m, "quantization_config") })
	m := roundTrip(t, src, func(o *Options) { o.Devices = 4 })
	if m.Quantization != nil {
		t.Errorf("quantization %+v, want none", m.Quantization)
	}
	for _, e := range m.Tensors {
		if e.Scale != "" || e.Kind == weights.KindBlockScale || e.Kind == weights.KindRowScale || e.DType == "F8_E4M3" {
			t.Errorf("%s: %s %s scale %q in an unquantised conversion", e.Name, e.Kind, e.DType, e.Scale)
		}
	}
}

func TestWithoutMTP(t *testing.T) {
	src := presetDir(t, "deepseek-v3.2-tiny")
	out, _ := convertTo(t, src, func(o *Options) { o.AppendMTP = false })
	if err := weights.Verify(out); err != nil {
		t.Fatal(err)
	}
	w, cfg, err := weights.OpenWeights(out)
	if err != nil {
		t.Fatal(err)
	}
	defer w.(*weights.Dir).Close()
	if cfg.NumNextNLayers != 0 || w.(*weights.Dir).Manifest().MTPLayers != 0 {
		t.Errorf("NumNextNLayers %d, want 0", cfg.NumNextNLayers)
	}
	hf, err := model.OpenHF(src)
	if err != nil {
		t.Fatal(err)
	}
	defer hf.Close()
	sameWeights(t, cfg, hf, w) // every main-model weight
	mtp := model.Layer(hf.Config().NumLayers).EHProj
	_, err = w.Get(mtp)
	wantErr(t, err, mtp, "MTP", "--append-mtp")
	for _, e := range w.(*weights.Dir).Manifest().Tensors {
		if l, ok := weights.LayerOf(e.Name); ok && l >= hf.Config().NumLayers {
			t.Errorf("MTP tensor %s stored", e.Name)
		}
	}
}

// TestAbsorbedMatchesKVB checks the documented meaning of W_UK and W_UV: row r of head h is row
// h*(nope+v)+r (W_UK) or h*(nope+v)+nope+r (W_UV) of the HF kv_b_proj, and the absorbed decode
// math (q_nope^T W_UK) . c equals the HF q_nope . (W_kb c) up to float rounding.
func TestAbsorbedMatchesKVB(t *testing.T) {
	for _, p := range presets {
		src := presetDir(t, p)
		out, _ := convertTo(t, src, nil)
		hf, err := model.OpenHF(src)
		if err != nil {
			t.Fatal(err)
		}
		w, cfg, err := weights.OpenWeights(out)
		if err != nil {
			t.Fatal(err)
		}
		for l := range cfg.NumAllLayers() {
			kvb, err := hf.Get(model.Layer(l).KVBProj)
			if err != nil {
				t.Fatal(err)
			}
			ukName, uvName := weights.AbsorbedNames(l)
			uk, err := w.Get(ukName)
			if err != nil {
				t.Fatal(err)
			}
			uv, err := w.Get(uvName)
			if err != nil {
				t.Fatal(err)
			}
			H, nope, v, kvl := cfg.NumHeads, cfg.QKNopeHeadDim, cfg.VHeadDim, cfg.KVLoraRank
			if !slices.Equal(uk.Shape, []int{H, nope, kvl}) || !slices.Equal(uv.Shape, []int{H, v, kvl}) {
				t.Fatalf("%s: shapes %v %v", p, uk.Shape, uv.Shape)
			}
			for h := range H {
				for r := range nope {
					if !slices.Equal(uk.Data[(h*nope+r)*kvl:][:kvl], kvb.Data[(h*(nope+v)+r)*kvl:][:kvl]) {
						t.Fatalf("%s layer %d: W_UK[%d,%d] is not kv_b_proj row %d", p, l, h, r, h*(nope+v)+r)
					}
				}
				for r := range v {
					if !slices.Equal(uv.Data[(h*v+r)*kvl:][:kvl], kvb.Data[(h*(nope+v)+nope+r)*kvl:][:kvl]) {
						t.Fatalf("%s layer %d: W_UV[%d,%d] is not kv_b_proj row %d", p, l, h, r, h*(nope+v)+nope+r)
					}
				}
			}
			// Score of head 0 for a latent c: HF computes k = W_kb c then q.k; absorbed computes
			// (W_UK^T q) . c.
			q, c := make([]float64, nope), make([]float64, kvl)
			for i := range q {
				q[i] = float64(i%7) - 3
			}
			for i := range c {
				c[i] = float64(i%5)/5 - 0.4
			}
			var hfScore, absScore float64
			for r := range nope {
				var k float64
				for j := range kvl {
					k += float64(kvb.Data[r*kvl+j]) * c[j]
				}
				hfScore += q[r] * k
			}
			for j := range kvl {
				var qa float64
				for r := range nope {
					qa += q[r] * float64(uk.Data[r*kvl+j])
				}
				absScore += qa * c[j]
			}
			if d := hfScore - absScore; d > 1e-9*max(1, abs(hfScore)) || -d > 1e-9*max(1, abs(hfScore)) {
				t.Errorf("%s layer %d: absorbed score %v, HF %v", p, l, absScore, hfScore)
			}
		}
		hf.Close()
		w.(*weights.Dir).Close()
	}
}

func abs(x float64) float64 {
	if x < 0 {
		return -x
	}
	return x
}

// TestLayoutGolden pins the stored layout (names, kinds, dtypes, shapes, devices, shards and
// offsets) of the tiny presets; run with -update after an intended layout change (and bump
// weights.LayoutVersion when an older loader would misread it).
func TestLayoutGolden(t *testing.T) {
	for _, p := range presets {
		out, _ := convertTo(t, presetDir(t, p), func(o *Options) { o.Devices = 2 })
		m, err := weights.ReadManifest(out)
		if err != nil {
			t.Fatal(err)
		}
		type row struct {
			Name   string       `json:"name"`
			Kind   weights.Kind `json:"kind"`
			DType  string       `json:"dtype"`
			Shape  []int64      `json:"shape"`
			Device int          `json:"device"`
			Shard  string       `json:"shard"`
			Offset int64        `json:"offset"`
			Scale  string       `json:"scale,omitempty"`
		}
		var rows []row
		for _, e := range m.Tensors {
			rows = append(rows, row{e.Name, e.Kind, e.DType, e.Shape, e.Device, e.Shard, e.Offset, e.Scale})
		}
		var got []byte
		for _, r := range rows {
			b, _ := json.Marshal(r)
			got = append(append(got, b...), '\n')
		}
		golden := filepath.Join("testdata", p+".devices2.layout.jsonl")
		if *update {
			if err := os.WriteFile(golden, got, 0o644); err != nil {
				t.Fatal(err)
			}
		}
		want, err := os.ReadFile(golden)
		if err != nil {
			t.Fatalf("%v (run go test ./convert -run TestLayoutGolden -update)", err)
		}
		if string(got) != string(want) {
			t.Errorf("%s: stored layout differs from %s (run with -update if intended)", p, golden)
		}
	}
}
