package model

import (
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/cockroachdb/errors"
)

func TestParseModelName(t *testing.T) {
	tests := []struct {
		in   string
		want Family
		err  bool
	}{
		{"glm5", GLMMoEDSA, false},
		{"glm-5", GLMMoEDSA, false},
		{"GLM-5", GLMMoEDSA, false},
		{"glm-5.1", GLMMoEDSA, false},
		{"glm5.1", GLMMoEDSA, false},
		{"glm_moe_dsa", GLMMoEDSA, false},
		{"zai-org/GLM-5.1-FP8", GLMMoEDSA, false},
		{"deepseek-v3.2", DeepSeekV32, false},
		{"DeepSeek-V3.2", DeepSeekV32, false},
		{"deepseek_v32", DeepSeekV32, false},
		{"dsv32", DeepSeekV32, false},
		{"ds-v3.2", DeepSeekV32, false},
		{"deepseek-ai/DeepSeek-V3.2-Exp", DeepSeekV32, false},
		{" deepseek-v3.2 ", DeepSeekV32, false},
		{"deepseek-v3", "", true},
		{"glm-4.5", "", true},
		{"llama", "", true},
		{"", "", true},
	}
	for _, tc := range tests {
		t.Run(tc.in, func(t *testing.T) {
			got, err := ParseModelName(tc.in)
			if tc.err {
				if err == nil {
					t.Fatalf("ParseModelName(%q) = %q, want error", tc.in, got)
				}
				if !strings.Contains(strings.Join(errors.GetAllHints(err), " "), "glm-5") {
					t.Errorf("error %v has no hint listing the accepted names", err)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("ParseModelName(%q) = %q, %v; want %q", tc.in, got, err, tc.want)
			}
		})
	}
}

func readTestConfig(t *testing.T, name string) map[string]any {
	t.Helper()
	data, err := os.ReadFile(filepath.Join("testdata", name))
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(data, &m); err != nil {
		t.Fatal(err)
	}
	return m
}

func mustJSON(t *testing.T, v any) []byte {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// The testdata configs mirror the published DeepSeek-V3.2 and GLM-5 config.json files.
func TestParseRealConfigs(t *testing.T) {
	ds, err := ParseConfig(mustJSON(t, readTestConfig(t, "deepseek-v3.2.config.json")))
	if err != nil {
		t.Fatal(err)
	}
	if ds.Family != DeepSeekV32 || ds.NumLayers != 61 || ds.NumNextNLayers != 1 || ds.HiddenSize != 7168 ||
		ds.QLoraRank != 1536 || ds.KVLoraRank != 512 || ds.NGroup != 8 || ds.TopKGroup != 4 || ds.IndexNHeads != 64 ||
		ds.IndexTopK != 2048 || ds.RopeTheta != 10000 || ds.Rope.Type != "yarn" || ds.Rope.Factor != 40 ||
		ds.Rope.OriginalMaxPositionEmbeddings != 4096 || ds.BOS != 0 || len(ds.EOS) != 1 || ds.EOS[0] != 1 {
		t.Errorf("deepseek config parsed wrong: %+v", ds)
	}
	if !ds.RopeInterleave || ds.IndexerRopeInterleave {
		t.Errorf("deepseek interleave flags = %v/%v, want main interleaved, indexer half-split", ds.RopeInterleave, ds.IndexerRopeInterleave)
	}
	if ds.Quant == nil || ds.Quant.Fmt != "e4m3" || ds.Quant.WeightBlockSize != [2]int{128, 128} || ds.Quant.ScaleFmt != "ue8m0" {
		t.Errorf("deepseek quant = %+v", ds.Quant)
	}
	for i := range 3 {
		if ds.IsMoELayer(i) {
			t.Errorf("layer %d should be dense", i)
		}
	}
	if !ds.IsMoELayer(3) || !ds.IsMoELayer(60) || !ds.IsMoELayer(61) || !ds.IsMTPLayer(61) || ds.IsMTPLayer(60) {
		t.Error("layers 3..61 should be MoE and 61 the MTP layer")
	}
	// 192^-0.5 * (0.1*ln 40 + 1)^2
	m := 0.1*math.Log(40) + 1
	if got, want := ds.SoftmaxScale(), math.Pow(192, -0.5)*m*m; math.Abs(got-want) > 1e-12 {
		t.Errorf("deepseek SoftmaxScale = %v, want %v", got, want)
	}
	if got := ds.RopeAttentionFactor(); got != 1 {
		t.Errorf("deepseek rope attention factor = %v, want 1 (mscale == mscale_all_dim)", got)
	}

	glm, err := ParseConfig(mustJSON(t, readTestConfig(t, "glm-5.config.json")))
	if err != nil {
		t.Fatal(err)
	}
	if glm.Family != GLMMoEDSA || glm.NumLayers != 78 || glm.NGroup != 1 || glm.TopKGroup != 1 || glm.IndexNHeads != 32 ||
		glm.RopeTheta != 1e6 || glm.Rope.Type != "default" || glm.BOS != -1 || len(glm.EOS) != 3 || glm.VHeadDim != 256 ||
		glm.RMSNormEps != 1e-5 {
		t.Errorf("glm config parsed wrong: %+v", glm)
	}
	if !glm.RopeInterleave || !glm.IndexerRopeInterleave {
		t.Error("glm: both RoPEs must be interleaved")
	}
	if got, want := glm.SoftmaxScale(), 1/16.0; math.Abs(got-want) > 1e-15 {
		t.Errorf("glm SoftmaxScale = %v, want %v", got, want)
	}
	for i := range glm.NumLayers {
		if !glm.HasIndexer(i) {
			t.Errorf("glm layer %d: default indexer_types should be all full", i)
		}
	}
}

func TestRopeInvFreq(t *testing.T) {
	c, err := ParseConfig(mustJSON(t, readTestConfig(t, "deepseek-v3.2.config.json")))
	if err != nil {
		t.Fatal(err)
	}
	inv := c.RopeInvFreq()
	if len(inv) != 32 {
		t.Fatalf("len = %d", len(inv))
	}
	// Highest frequencies (below the correction range) are unscaled; the lowest are divided by factor.
	if inv[0] != 1 {
		t.Errorf("inv[0] = %v, want 1", inv[0])
	}
	plain := 1 / math.Pow(10000, 62.0/64)
	if math.Abs(inv[31]-plain/40) > 1e-15 {
		t.Errorf("inv[31] = %v, want %v", inv[31], plain/40)
	}
	for i := 1; i < len(inv); i++ {
		if !(inv[i] < inv[i-1]) {
			t.Errorf("inv freq not decreasing at %d", i)
		}
	}
	c.Rope.Type = "default"
	if got := c.RopeInvFreq()[31]; math.Abs(got-plain) > 1e-15 {
		t.Errorf("default inv[31] = %v, want %v", got, plain)
	}
}

func TestRopeParametersForm(t *testing.T) {
	m := readTestConfig(t, "deepseek-v3.2.config.json")
	delete(m, "rope_scaling")
	delete(m, "rope_theta")
	m["rope_parameters"] = map[string]any{"rope_type": "yarn", "rope_theta": 20000, "factor": 4, "mscale_all_dim": 0.5,
		"original_max_position_embeddings": 1024}
	c, err := ParseConfig(mustJSON(t, m))
	if err != nil {
		t.Fatal(err)
	}
	if c.RopeTheta != 20000 || c.Rope.Factor != 4 || c.Rope.BetaFast != 32 || c.Rope.BetaSlow != 1 || !c.Rope.Truncate {
		t.Errorf("rope = %v %+v", c.RopeTheta, c.Rope)
	}
	mm := 0.1*0.5*math.Log(4) + 1
	if got, want := c.SoftmaxScale(), math.Pow(192, -0.5)*mm*mm; math.Abs(got-want) > 1e-12 {
		t.Errorf("SoftmaxScale = %v want %v", got, want)
	}
	// mscale absent: attention factor falls back to mscale(factor, 1).
	if got, want := c.RopeAttentionFactor(), 0.1*math.Log(4)+1; math.Abs(got-want) > 1e-12 {
		t.Errorf("RopeAttentionFactor = %v want %v", got, want)
	}
}

func TestGLMIndexerTypes(t *testing.T) {
	tests := []struct {
		name string
		set  map[string]any
		want string // F/S per layer for an 8-layer model
	}{
		{"default all full", nil, "FFFFFFFF"},
		{"freq 4 offset 3", map[string]any{"index_topk_freq": 4, "index_skip_topk_offset": 3}, "FFFSSSFS"},
		{"pattern", map[string]any{"index_topk_pattern": "FSFSFSFS"}, "FSFSFSFS"},
		{"explicit", map[string]any{"indexer_types": []string{"full", "full", "shared", "shared", "full", "shared", "shared", "shared"}}, "FFSSFSSS"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			m := readTestConfig(t, "glm-5.config.json")
			m["num_hidden_layers"] = 8
			for k, v := range tc.set {
				m[k] = v
			}
			c, err := ParseConfig(mustJSON(t, m))
			if err != nil {
				t.Fatal(err)
			}
			var got strings.Builder
			for i := range 8 {
				if c.HasIndexer(i) {
					got.WriteByte('F')
				} else {
					got.WriteByte('S')
				}
			}
			if got.String() != tc.want {
				t.Errorf("indexer types = %s, want %s", got.String(), tc.want)
			}
		})
	}
}

func TestParseConfigErrors(t *testing.T) {
	tests := []struct {
		name   string
		base   string
		mutate func(m map[string]any)
		want   string // substring of the error (the field name)
	}{
		{"unknown model_type", "deepseek-v3.2.config.json", func(m map[string]any) { m["model_type"] = "deepseek_v3" }, "model_type"},
		{"missing model_type", "deepseek-v3.2.config.json", func(m map[string]any) { delete(m, "model_type") }, "model_type"},
		{"missing kv_lora_rank", "deepseek-v3.2.config.json", func(m map[string]any) { delete(m, "kv_lora_rank") }, "kv_lora_rank"},
		{"zero hidden", "glm-5.config.json", func(m map[string]any) { m["hidden_size"] = 0 }, "hidden_size"},
		{"string vocab", "glm-5.config.json", func(m map[string]any) { m["vocab_size"] = "big" }, "vocab_size"},
		{"fractional heads", "glm-5.config.json", func(m map[string]any) { m["num_attention_heads"] = 1.5 }, "num_attention_heads"},
		{"null q_lora", "deepseek-v3.2.config.json", func(m map[string]any) { m["q_lora_rank"] = nil }, "q_lora_rank"},
		{"odd rope dim", "deepseek-v3.2.config.json", func(m map[string]any) { m["qk_rope_head_dim"] = 63 }, "qk_rope_head_dim"},
		{"group not dividing", "deepseek-v3.2.config.json", func(m map[string]any) { m["n_group"] = 7 }, "n_group"},
		{"topk_group > n_group", "deepseek-v3.2.config.json", func(m map[string]any) { m["topk_group"] = 9 }, "topk_group"},
		{"too many experts per tok", "glm-5.config.json", func(m map[string]any) { m["num_experts_per_tok"] = 300 }, "num_experts_per_tok"},
		{"gqa", "glm-5.config.json", func(m map[string]any) { m["num_key_value_heads"] = 8 }, "num_key_value_heads"},
		{"rope type", "glm-5.config.json", func(m map[string]any) {
			m["rope_parameters"] = map[string]any{"rope_type": "llama3", "rope_theta": 1e6}
		}, "rope_parameters"},
		{"yarn no factor", "deepseek-v3.2.config.json", func(m map[string]any) {
			m["rope_scaling"] = map[string]any{"type": "yarn", "factor": 0, "original_max_position_embeddings": 4096}
		}, "factor"},
		{"quant method", "deepseek-v3.2.config.json", func(m map[string]any) {
			m["quantization_config"] = map[string]any{"quant_method": "gptq"}
		}, "quant_method"},
		{"quant fmt", "deepseek-v3.2.config.json", func(m map[string]any) {
			m["quantization_config"] = map[string]any{"quant_method": "fp8", "fmt": "e5m2"}
		}, "fmt"},
		{"quant block", "deepseek-v3.2.config.json", func(m map[string]any) {
			m["quantization_config"] = map[string]any{"quant_method": "fp8", "weight_block_size": []int{64, 64}}
		}, "weight_block_size"},
		{"activation", "glm-5.config.json", func(m map[string]any) { m["hidden_act"] = "gelu" }, "hidden_act"},
		{"softmax router", "glm-5.config.json", func(m map[string]any) { m["scoring_func"] = "softmax" }, "scoring_func"},
		{"mlp_layer_types length", "glm-5.config.json", func(m map[string]any) { m["mlp_layer_types"] = []string{"dense"} }, "mlp_layer_types"},
		{"mlp_layer_types value", "glm-5.config.json", func(m map[string]any) {
			l := make([]string, 78)
			for i := range l {
				l[i] = "moe"
			}
			m["mlp_layer_types"] = l
		}, "mlp_layer_types"},
		{"shared first indexer", "glm-5.config.json", func(m map[string]any) { m["index_topk_pattern"] = "S" + strings.Repeat("F", 77) }, "indexer_types"},
		{"eos outside vocab", "glm-5.config.json", func(m map[string]any) { m["eos_token_id"] = []int{999999} }, "eos_token_id"},
		{"no eos", "glm-5.config.json", func(m map[string]any) { delete(m, "eos_token_id") }, "eos_token_id"},
		{"bias", "glm-5.config.json", func(m map[string]any) { m["attention_bias"] = true }, "attention_bias"},
		{"non-interleaved", "glm-5.config.json", func(m map[string]any) { m["rope_interleave"] = false }, "rope_interleave"},
		{"index dim", "glm-5.config.json", func(m map[string]any) { m["index_head_dim"] = 32 }, "index_head_dim"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			m := readTestConfig(t, tc.base)
			tc.mutate(m)
			_, err := ParseConfig(mustJSON(t, m))
			if err == nil {
				t.Fatal("want an error")
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %q does not name %q", err, tc.want)
			}
		})
	}
}

func TestUnknownModelTypeHint(t *testing.T) {
	_, err := ParseConfig([]byte(`{"model_type":"llama"}`))
	if err == nil {
		t.Fatal("want error")
	}
	h := strings.Join(errors.GetAllHints(err), " ")
	if !strings.Contains(h, "deepseek_v32") || !strings.Contains(h, "glm_moe_dsa") {
		t.Errorf("hint %q should list the supported model types", h)
	}
	if _, err := ParseConfig([]byte(`not json`)); err == nil {
		t.Error("want error for invalid JSON")
	}
}

func TestLoadConfigMissingFile(t *testing.T) {
	_, err := LoadConfig(t.TempDir())
	if err == nil || !strings.Contains(err.Error(), "config.json") {
		t.Fatalf("err = %v", err)
	}
}
