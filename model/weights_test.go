package model_test

import (
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/tilert-go/tilert/model"
	"github.com/tilert-go/tilert/model/synth"
	"github.com/tilert-go/tilert/numeric"
	"github.com/tilert-go/tilert/safetensors"
)

// tinyCheckpoint writes a fresh synthetic checkpoint (cached per test binary, copied per test).
func tinyCheckpoint(t *testing.T, preset string) string {
	t.Helper()
	src := filepath.Join(os.TempDir(), "tilert-model-test-"+preset+"-"+strings.ReplaceAll(t.Name(), "/", "_"))
	os.RemoveAll(src)
	if err := synth.Write(preset, src, 0, nil); err != nil {
		t.Fatalf("%+v", err)
	}
	t.Cleanup(func() { os.RemoveAll(src) })
	return src
}

func TestOpenWeightsGood(t *testing.T) {
	for _, preset := range []string{"deepseek-v3.2-tiny", "glm-5-tiny"} {
		t.Run(preset, func(t *testing.T) {
			dir := tinyCheckpoint(t, preset)
			w, err := model.OpenHF(dir)
			if err != nil {
				t.Fatalf("%+v", err)
			}
			defer w.Close()
			c := w.Config()
			shapes := model.ExpectedShapes(c)
			for _, name := range []string{model.EmbedTokensName, model.LMHeadName, model.Layer(0).KVAProj, model.Layer(c.NumLayers).EHProj} {
				tn, err := w.Get(name)
				if err != nil {
					t.Fatalf("%+v", err)
				}
				if !slices.Equal(tn.Shape, shapes[name]) || len(tn.Data) != tn.Shape[0]*tn.Shape[len(tn.Shape)-1] {
					t.Errorf("%s: shape %v (%d values), want %v", name, tn.Shape, len(tn.Data), shapes[name])
				}
			}
			// FP8 dequantisation follows W[i,j] = w[i,j] * s[i/128][j/128], including partial blocks:
			// kv_a_proj_with_mqa is 576 rows (partial row block) x hidden (partial column block for 160/288).
			name := model.Layer(1).KVAProj
			r, err := w.Raw(name)
			if err != nil {
				t.Fatal(err)
			}
			tn, _ := w.Get(name)
			rows, cols := tn.Shape[0], tn.Shape[1]
			bc := (cols + 127) / 128
			for _, ij := range [][2]int{{0, 0}, {0, cols - 1}, {127, 128}, {128, 127}, {rows - 1, cols - 1}, {513, 130}} {
				i, j := ij[0], ij[1]
				want := numeric.FP8E4M3ToFloat32(r.Data[i*cols+j]) * r.Scale[(i/128)*bc+j/128]
				if got := tn.Data[i*cols+j]; got != want {
					t.Errorf("%s[%d,%d] = %v, want %v", name, i, j, got, want)
				}
			}
			if _, err := w.Get("model.layers.0.mlp.experts.0.gate_proj.weight"); err == nil {
				t.Error("layer 0 is dense: expert weights must be unknown")
			}
			if v := tn.Data[0]; math.IsNaN(float64(v)) {
				t.Error("NaN")
			}
		})
	}
}

// shardOf finds the shard file holding name.
func shardOf(t *testing.T, dir, name string) string {
	t.Helper()
	idx, err := safetensors.ReadIndex(dir)
	if err != nil {
		t.Fatal(err)
	}
	s, ok := idx.WeightMap[name]
	if !ok {
		t.Fatalf("%s not in index", name)
	}
	return filepath.Join(dir, s)
}

// rewriteShard loads the shard holding name, lets edit change its tensor list, and writes it back.
func rewriteShard(t *testing.T, dir, name string, edit func([]safetensors.Tensor) []safetensors.Tensor) string {
	t.Helper()
	path := shardOf(t, dir, name)
	f, err := safetensors.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	var ts []safetensors.Tensor
	for _, info := range f.Tensors() {
		d, err := f.Data(info.Name)
		if err != nil {
			t.Fatal(err)
		}
		info.Begin, info.End = 0, 0
		ts = append(ts, safetensors.Tensor{Info: info, Data: slices.Clone(d)})
	}
	f.Close()
	if err := safetensors.WriteFile(path, edit(ts), map[string]string{"format": "pt"}); err != nil {
		t.Fatal(err)
	}
	return path
}

func dropFromIndex(t *testing.T, dir, name string) {
	t.Helper()
	idx, err := safetensors.ReadIndex(dir)
	if err != nil {
		t.Fatal(err)
	}
	delete(idx.WeightMap, name)
	data, _ := json.Marshal(idx)
	if err := os.WriteFile(filepath.Join(dir, safetensors.IndexFile), data, 0o644); err != nil {
		t.Fatal(err)
	}
}

func TestBadCheckpoints(t *testing.T) {
	norm := model.Layer(1).QANorm
	fp8 := model.Layer(2).QBProj
	tests := []struct {
		name   string
		break_ func(t *testing.T, dir string) (file string)
		want   []string // substrings of the error
	}{
		{"truncated shard", func(t *testing.T, dir string) string {
			p := shardOf(t, dir, fp8)
			st, _ := os.Stat(p)
			if err := os.Truncate(p, st.Size()-1000); err != nil {
				t.Fatal(err)
			}
			return filepath.Base(p)
		}, nil},
		{"missing tensor", func(t *testing.T, dir string) string {
			rewriteShard(t, dir, norm, func(ts []safetensors.Tensor) []safetensors.Tensor {
				return slices.DeleteFunc(ts, func(x safetensors.Tensor) bool { return x.Info.Name == norm })
			})
			dropFromIndex(t, dir, norm)
			return dir
		}, []string{norm, "missing"}},
		{"tensor missing from shard but in index", func(t *testing.T, dir string) string {
			p := rewriteShard(t, dir, norm, func(ts []safetensors.Tensor) []safetensors.Tensor {
				return slices.DeleteFunc(ts, func(x safetensors.Tensor) bool { return x.Info.Name == norm })
			})
			return filepath.Base(p)
		}, []string{norm}},
		{"wrong shape", func(t *testing.T, dir string) string {
			p := rewriteShard(t, dir, norm, func(ts []safetensors.Tensor) []safetensors.Tensor {
				for i := range ts {
					if ts[i].Info.Name == norm {
						ts[i].Info.Shape = []int64{ts[i].Info.Shape[0] / 2, 2}
					}
				}
				return ts
			})
			return filepath.Base(p)
		}, []string{norm, "shape"}},
		{"wrong dtype", func(t *testing.T, dir string) string {
			p := rewriteShard(t, dir, norm, func(ts []safetensors.Tensor) []safetensors.Tensor {
				for i := range ts {
					if ts[i].Info.Name == norm {
						ts[i].Info.DType = safetensors.I16
					}
				}
				return ts
			})
			return filepath.Base(p)
		}, []string{norm, "dtype", "I16"}},
		{"fp8 without scale", func(t *testing.T, dir string) string {
			sn := model.ScaleName(fp8)
			p := rewriteShard(t, dir, sn, func(ts []safetensors.Tensor) []safetensors.Tensor {
				return slices.DeleteFunc(ts, func(x safetensors.Tensor) bool { return x.Info.Name == sn })
			})
			dropFromIndex(t, dir, sn)
			return filepath.Base(p)
		}, []string{fp8, "weight_scale_inv"}},
		{"wrong scale shape", func(t *testing.T, dir string) string {
			sn := model.ScaleName(fp8)
			p := rewriteShard(t, dir, sn, func(ts []safetensors.Tensor) []safetensors.Tensor {
				for i := range ts {
					if ts[i].Info.Name == sn {
						s := ts[i].Info.Shape
						ts[i].Info.Shape = []int64{s[1], s[0]}
					}
				}
				return ts
			})
			return filepath.Base(p)
		}, []string{model.ScaleName(fp8), "shape"}},
		{"unknown model_type", func(t *testing.T, dir string) string {
			p := filepath.Join(dir, "config.json")
			data, _ := os.ReadFile(p)
			data = []byte(strings.Replace(string(data), `"model_type": "`, `"model_type": "x`, 1))
			os.WriteFile(p, data, 0o644)
			return "config.json"
		}, []string{"model_type", "deepseek_v32"}},
		{"config disagrees with weights", func(t *testing.T, dir string) string {
			p := filepath.Join(dir, "config.json")
			var m map[string]any
			data, _ := os.ReadFile(p)
			json.Unmarshal(data, &m)
			m["q_lora_rank"] = 64
			data, _ = json.Marshal(m)
			os.WriteFile(p, data, 0o644)
			return "safetensors"
		}, []string{"q_a_proj", "shape"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			dir := tinyCheckpoint(t, "deepseek-v3.2-tiny")
			file := tc.break_(t, dir)
			w, err := model.OpenWeights(dir)
			if err == nil {
				t.Fatalf("OpenWeights accepted a broken checkpoint (%v)", w)
			}
			msg := err.Error()
			for _, s := range append(tc.want, file) {
				if !strings.Contains(msg, s) {
					t.Errorf("error %q does not mention %q", msg, s)
				}
			}
		})
	}
}

func TestSpecsCoverMTPAndAreUnique(t *testing.T) {
	data, err := os.ReadFile(filepath.Join("testdata", "deepseek-v3.2.config.json"))
	if err != nil {
		t.Fatal(err)
	}
	c, err := model.ParseConfig(data)
	if err != nil {
		t.Fatal(err)
	}
	specs := model.Specs(c)
	seen := map[string]bool{}
	var fp8, bytes int64
	for _, s := range specs {
		if seen[s.Name] {
			t.Fatalf("duplicate %s", s.Name)
		}
		seen[s.Name] = true
		n := int64(1)
		for _, d := range s.Shape {
			n *= int64(d)
		}
		if s.Quantized(c) {
			fp8 += n
			bytes += n
		} else {
			bytes += 2 * n
		}
	}
	mtp := model.Layer(61)
	for _, n := range []string{mtp.EHProj, mtp.ENorm, mtp.HNorm, mtp.MTPEmbed, mtp.SharedHeadHead, mtp.SharedHeadNorm, mtp.KVBProj, mtp.Router} {
		if !seen[n] {
			t.Errorf("MTP tensor %s missing from Specs", n)
		}
	}
	if seen["model.layers.2.mlp.gate.weight"] || !seen["model.layers.2.mlp.down_proj.weight"] || !seen["model.layers.3.mlp.experts.255.down_proj.weight"] {
		t.Error("dense/MoE layer split wrong")
	}
	// The released DeepSeek-V3.2 FP8 checkpoint is about 690 GB including MTP.
	if gb := float64(bytes) / 1e9; gb < 640 || gb > 720 {
		t.Errorf("implied checkpoint size %.0f GB, want about 690", gb)
	}
	if fp8 < bytes*9/10 {
		t.Errorf("only %d of %d bytes are FP8", fp8, bytes)
	}
}
