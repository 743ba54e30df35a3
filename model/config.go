// Package model describes the DeepSeek-V3.2 and GLM-5 model families: the HF config.json,
// tensor names and shapes, and float32 access to (FP8 block-quantised) checkpoint weights.
package model

import (
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strings"

	"github.com/cockroachdb/errors"
)

// Family is the HF model_type of a supported model family.
type Family string

const (
	DeepSeekV32 Family = "deepseek_v32"
	GLMMoEDSA   Family = "glm_moe_dsa"
)

// Families lists the supported families in a stable order (for messages).
var Families = []Family{DeepSeekV32, GLMMoEDSA}

// modelNameAliases maps a normalised user spelling (lower case, separators removed,
// org prefix dropped) to its family.
var modelNameAliases = map[string]Family{
	"deepseekv32":         DeepSeekV32,
	"deepseekv32exp":      DeepSeekV32,
	"deepseekv32speciale": DeepSeekV32,
	"dsv32":               DeepSeekV32,
	"v32":                 DeepSeekV32,
	"glm5":                GLMMoEDSA,
	"glm51":               GLMMoEDSA,
	"glm5fp8":             GLMMoEDSA,
	"glm51fp8":            GLMMoEDSA,
	"glmmoedsa":           GLMMoEDSA,
}

// ParseModelName maps a user-facing model name (glm-5, glm5.1, deepseek-v3.2, dsv32,
// zai-org/GLM-5, deepseek_v32, ...) to its Family.
func ParseModelName(s string) (Family, error) {
	n := strings.ToLower(strings.TrimSpace(s))
	if i := strings.LastIndex(n, "/"); i >= 0 {
		n = n[i+1:]
	}
	n = strings.Map(func(r rune) rune {
		switch r {
		case '-', '_', '.', ' ':
			return -1
		}
		return r
	}, n)
	if f, ok := modelNameAliases[n]; ok {
		return f, nil
	}
	return "", errors.WithHint(
		errors.Newf("unknown model name %q", s),
		"use one of: glm-5, glm-5.1, deepseek-v3.2 (also accepted: glm5, glm5.1, glm_moe_dsa, deepseek_v32, dsv32)")
}

// RopeScaling is the resolved RoPE parameter set (HF rope_scaling or rope_parameters).
type RopeScaling struct {
	Type                          string  // "default" or "yarn"
	Factor                        float64 // yarn only
	OriginalMaxPositionEmbeddings int     // yarn only
	BetaFast, BetaSlow            float64 // yarn only (HF defaults 32 and 1)
	Mscale, MscaleAllDim          float64 // yarn only; 0 when absent
	AttentionFactor               float64 // explicit attention_factor, 0 when absent (then derived)
	Truncate                      bool    // yarn correction-range truncation (HF default true)
}

// QuantConfig is the checkpoint's quantization_config.
type QuantConfig struct {
	Method           string // "fp8"
	Fmt              string // "e4m3"
	WeightBlockSize  [2]int // [128, 128]
	ActivationScheme string // "dynamic" (informational)
	ScaleFmt         string // "", "float" or "ue8m0" (informational: scales are read as stored)
}

// Config is a validated model configuration with every field the engines need.
type Config struct {
	Family Family

	VocabSize, HiddenSize, IntermediateSize, MoEIntermediateSize, NumLayers int
	NumHeads, QLoraRank, KVLoraRank, QKNopeHeadDim, QKRopeHeadDim, VHeadDim int

	NRoutedExperts, NSharedExperts, NumExpertsPerTok, NGroup, TopKGroup, FirstKDenseReplace int
	RoutedScalingFactor                                                                     float64
	NormTopKProb                                                                            bool
	RMSNormEps                                                                              float64

	IndexNHeads, IndexHeadDim, IndexTopK int

	RopeTheta float64
	Rope      RopeScaling
	// RopeInterleave: main MLA RoPE pairs (x0,x1),(x2,x3)... (true for both families).
	RopeInterleave bool
	// IndexerRopeInterleave: indexer RoPE pairing; false = half-split (DeepSeek-V3.2), true = GLM-5.
	IndexerRopeInterleave bool

	NumNextNLayers        int
	MaxPositionEmbeddings int

	BOS               int // -1 when the config has none
	EOS               []int
	TieWordEmbeddings bool
	Quant             *QuantConfig // nil: unquantised checkpoint

	// MLPLayerTypes has NumLayers entries, "dense" or "sparse" (HF mlp_layer_types, else derived
	// from FirstKDenseReplace).
	MLPLayerTypes []string
	// IndexerTypes has NumLayers entries, "full" (runs its own indexer) or "shared" (GLM: reuses the
	// previous full layer's top-k and has no indexer weights).
	IndexerTypes []string

	// Raw is the config.json as read, for tools that must carry it along (the converter manifest).
	Raw json.RawMessage
}

// QKHeadDim is the per-head query/key width (nope + rope).
func (c *Config) QKHeadDim() int { return c.QKNopeHeadDim + c.QKRopeHeadDim }

// NumAllLayers counts decoder blocks including the MTP layers (indices NumLayers..).
func (c *Config) NumAllLayers() int { return c.NumLayers + c.NumNextNLayers }

// IsMTPLayer reports whether layer index i is a multi-token-prediction layer.
func (c *Config) IsMTPLayer(i int) bool { return i >= c.NumLayers && i < c.NumAllLayers() }

// IsMoELayer reports whether decoder block i (0..NumAllLayers()-1) has a MoE MLP. MTP layers follow
// the first_k_dense_replace rule, as DeepSeek's reference does (HF's mlp_layer_types only covers the
// main layers).
func (c *Config) IsMoELayer(i int) bool {
	if i < 0 {
		return false
	}
	if i < c.NumLayers && i < len(c.MLPLayerTypes) {
		return c.MLPLayerTypes[i] == "sparse"
	}
	return i >= c.FirstKDenseReplace && c.NRoutedExperts > 0
}

// HasIndexer reports whether block i runs (and has weights for) its own DSA indexer. MTP layers
// always do.
func (c *Config) HasIndexer(i int) bool {
	if i >= 0 && i < c.NumLayers && i < len(c.IndexerTypes) {
		return c.IndexerTypes[i] == "full"
	}
	return true
}

// yarnMscale is YaRN's attention-temperature correction 0.1*m*ln(s)+1 (1 when s <= 1).
func yarnMscale(scale, m float64) float64 {
	if scale <= 1 {
		return 1
	}
	return 0.1*m*math.Log(scale) + 1
}

// SoftmaxScale is the MLA attention score scale. As in HF: qk_head_dim^-0.5, multiplied by
// mscale(factor, mscale_all_dim)^2 when RoPE is not "default" and mscale_all_dim is non-zero
// (DeepSeek-V3.2: 192^-0.5 * (0.1*ln 40 + 1)^2; GLM-5: 256^-0.5).
func (c *Config) SoftmaxScale() float64 {
	s := math.Pow(float64(c.QKHeadDim()), -0.5)
	if c.Rope.Type != "default" && c.Rope.MscaleAllDim != 0 {
		m := yarnMscale(c.Rope.Factor, c.Rope.MscaleAllDim)
		s *= m * m
	}
	return s
}

// IndexerSoftmaxScale is the indexer's per-dot-product scale index_head_dim^-0.5.
func (c *Config) IndexerSoftmaxScale() float64 { return math.Pow(float64(c.IndexHeadDim), -0.5) }

// RopeAttentionFactor is the factor HF multiplies cos and sin by (YaRN "attention_factor"):
// explicit attention_factor, else mscale(f,mscale)/mscale(f,mscale_all_dim) when both are set,
// else mscale(f,1). 1 for default RoPE. DeepSeek-V3.2 (mscale == mscale_all_dim) gives exactly 1.
func (c *Config) RopeAttentionFactor() float64 {
	r := c.Rope
	if r.Type != "yarn" {
		return 1
	}
	if r.AttentionFactor != 0 {
		return r.AttentionFactor
	}
	if r.Mscale != 0 && r.MscaleAllDim != 0 {
		return yarnMscale(r.Factor, r.Mscale) / yarnMscale(r.Factor, r.MscaleAllDim)
	}
	return yarnMscale(r.Factor, 1)
}

// RopeInvFreq returns the QKRopeHeadDim/2 inverse frequencies of the rotary embedding (shared by
// the MLA and the indexer), following HF's default and YaRN initialisation.
func (c *Config) RopeInvFreq() []float64 {
	dim := c.QKRopeHeadDim
	half := dim / 2
	base := c.RopeTheta
	inv := make([]float64, half)
	for i := range half {
		inv[i] = 1 / math.Pow(base, float64(2*i)/float64(dim))
	}
	if c.Rope.Type != "yarn" {
		return inv
	}
	r := c.Rope
	corrDim := func(rot float64) float64 {
		return float64(dim) * math.Log(float64(r.OriginalMaxPositionEmbeddings)/(rot*2*math.Pi)) / (2 * math.Log(base))
	}
	low, high := corrDim(r.BetaFast), corrDim(r.BetaSlow)
	if r.Truncate {
		low, high = math.Floor(low), math.Ceil(high)
	}
	low, high = math.Max(low, 0), math.Min(high, float64(dim-1))
	if low == high {
		high += 0.001 // as HF: avoid a zero-width ramp
	}
	for i := range half {
		ramp := math.Min(math.Max((float64(i)-low)/(high-low), 0), 1)
		extra := 1 - ramp // weight of the unscaled (extrapolated) frequency
		inv[i] = inv[i]/r.Factor*(1-extra) + inv[i]*extra
	}
	return inv
}

// LoadConfig reads and validates dir/config.json.
func LoadConfig(dir string) (*Config, error) {
	path := filepath.Join(dir, "config.json")
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, errors.WithHint(errors.Wrapf(err, "read model config %s", path),
			"--model-dir must be a Hugging Face checkpoint directory containing config.json")
	}
	c, err := ParseConfig(data)
	if err != nil {
		return nil, errors.Wrapf(err, "%s", path)
	}
	return c, nil
}

// cfgReader reads typed fields out of the raw JSON object, remembering the first error.
type cfgReader struct {
	m   map[string]json.RawMessage
	err error
}

func (r *cfgReader) fail(err error) {
	if r.err == nil {
		r.err = err
	}
}

func (r *cfgReader) has(key string) bool {
	v, ok := r.m[key]
	return ok && string(v) != "null"
}

func fieldErr(key, format string, args ...any) error {
	return errors.Newf("config.json field %q: %s", key, fmt.Sprintf(format, args...))
}

func (r *cfgReader) float(key string, def float64) float64 {
	if !r.has(key) {
		return def
	}
	var f float64
	if err := json.Unmarshal(r.m[key], &f); err != nil {
		r.fail(fieldErr(key, "want a number, got %s", r.m[key]))
		return def
	}
	return f
}

func (r *cfgReader) int(key string, def int) int {
	if !r.has(key) {
		return def
	}
	f := r.float(key, float64(def))
	if f != math.Trunc(f) || math.Abs(f) > 1<<40 {
		r.fail(fieldErr(key, "want an integer, got %s", r.m[key]))
		return def
	}
	return int(f)
}

// required reads an integer that has no safe default.
func (r *cfgReader) required(key string) int {
	if !r.has(key) {
		r.fail(errors.WithHint(fieldErr(key, "missing"),
			"config.json must come from a deepseek_v32 or glm_moe_dsa checkpoint; add the field with the model's value"))
		return 0
	}
	return r.int(key, 0)
}

func (r *cfgReader) bool(key string, def bool) bool {
	if !r.has(key) {
		return def
	}
	var b bool
	if err := json.Unmarshal(r.m[key], &b); err != nil {
		r.fail(fieldErr(key, "want true or false, got %s", r.m[key]))
		return def
	}
	return b
}

func (r *cfgReader) str(key, def string) string {
	if !r.has(key) {
		return def
	}
	var s string
	if err := json.Unmarshal(r.m[key], &s); err != nil {
		r.fail(fieldErr(key, "want a string, got %s", r.m[key]))
		return def
	}
	return s
}

func (r *cfgReader) strList(key string) []string {
	if !r.has(key) {
		return nil
	}
	var s []string
	if err := json.Unmarshal(r.m[key], &s); err != nil {
		r.fail(fieldErr(key, "want a list of strings, got %s", r.m[key]))
		return nil
	}
	return s
}

// intOrList reads a field that HF allows as an int or a list of ints (eos_token_id).
func (r *cfgReader) intOrList(key string) []int {
	if !r.has(key) {
		return nil
	}
	var one int
	if err := json.Unmarshal(r.m[key], &one); err == nil {
		return []int{one}
	}
	var many []int
	if err := json.Unmarshal(r.m[key], &many); err != nil {
		r.fail(fieldErr(key, "want an integer or a list of integers, got %s", r.m[key]))
		return nil
	}
	return many
}

func (r *cfgReader) object(key string) map[string]json.RawMessage {
	if !r.has(key) {
		return nil
	}
	var o map[string]json.RawMessage
	if err := json.Unmarshal(r.m[key], &o); err != nil {
		r.fail(fieldErr(key, "want an object, got %s", r.m[key]))
		return nil
	}
	return o
}

// ParseConfig parses and validates an HF config.json.
func ParseConfig(data []byte) (*Config, error) {
	var m map[string]json.RawMessage
	if err := json.Unmarshal(data, &m); err != nil {
		return nil, errors.WithHint(errors.Wrap(err, "config.json is not a JSON object"),
			"check that the file is a complete Hugging Face config.json")
	}
	r := &cfgReader{m: m}
	mt := r.str("model_type", "")
	fam := Family(mt)
	if fam != DeepSeekV32 && fam != GLMMoEDSA {
		names := make([]string, len(Families))
		for i, f := range Families {
			names[i] = string(f)
		}
		return nil, errors.WithHint(
			errors.Newf("config.json field \"model_type\": unsupported model type %q", mt),
			"supported model types: "+strings.Join(names, ", ")+" (DeepSeek-V3.2 and GLM-5/5.1 checkpoints)")
	}
	if r.has("text_config") {
		return nil, errors.WithHint(fieldErr("text_config", "nested (multimodal) configs are not supported"),
			"point --model-dir at a text-only deepseek_v32 or glm_moe_dsa checkpoint")
	}

	c := &Config{Family: fam, Raw: append(json.RawMessage(nil), data...)}
	c.VocabSize = r.required("vocab_size")
	c.HiddenSize = r.required("hidden_size")
	c.IntermediateSize = r.required("intermediate_size")
	c.MoEIntermediateSize = r.required("moe_intermediate_size")
	c.NumLayers = r.required("num_hidden_layers")
	c.NumHeads = r.required("num_attention_heads")
	c.QLoraRank = r.required("q_lora_rank")
	c.KVLoraRank = r.required("kv_lora_rank")
	c.QKNopeHeadDim = r.required("qk_nope_head_dim")
	c.QKRopeHeadDim = r.required("qk_rope_head_dim")
	c.VHeadDim = r.required("v_head_dim")
	c.NRoutedExperts = r.required("n_routed_experts")
	c.NSharedExperts = r.int("n_shared_experts", 1)
	c.NumExpertsPerTok = r.required("num_experts_per_tok")
	c.NGroup = r.int("n_group", 1)
	c.TopKGroup = r.int("topk_group", 1)
	c.FirstKDenseReplace = r.int("first_k_dense_replace", 3)
	c.RoutedScalingFactor = r.float("routed_scaling_factor", 2.5)
	c.NormTopKProb = r.bool("norm_topk_prob", true)
	defEps := 1e-6
	if fam == GLMMoEDSA {
		defEps = 1e-5
	}
	c.RMSNormEps = r.float("rms_norm_eps", defEps)
	defIdxHeads := 64
	if fam == GLMMoEDSA {
		defIdxHeads = 32
	}
	c.IndexNHeads = r.int("index_n_heads", defIdxHeads)
	c.IndexHeadDim = r.int("index_head_dim", 128)
	c.IndexTopK = r.int("index_topk", 2048)
	c.NumNextNLayers = r.int("num_nextn_predict_layers", 0)
	c.MaxPositionEmbeddings = r.required("max_position_embeddings")
	c.TieWordEmbeddings = r.bool("tie_word_embeddings", false)
	c.RopeInterleave = r.bool("rope_interleave", true)
	// HF hard-codes the indexer pairing per family; vLLM and the GLM-5 config use this key.
	c.IndexerRopeInterleave = r.bool("indexer_rope_interleave", fam == GLMMoEDSA)
	c.BOS = -1
	if r.has("bos_token_id") {
		c.BOS = r.int("bos_token_id", -1)
	}
	c.EOS = r.intOrList("eos_token_id")
	c.MLPLayerTypes = r.strList("mlp_layer_types")
	c.IndexerTypes = r.strList("indexer_types")
	if r.err != nil {
		return nil, r.err
	}
	if err := c.parseRope(r); err != nil {
		return nil, err
	}
	if err := c.parseQuant(r); err != nil {
		return nil, err
	}
	if err := c.parseIndexerTypes(r); err != nil {
		return nil, err
	}
	if err := c.checkUnsupported(r); err != nil {
		return nil, err
	}
	if len(c.MLPLayerTypes) == 0 {
		c.MLPLayerTypes = make([]string, c.NumLayers)
		for i := range c.MLPLayerTypes {
			c.MLPLayerTypes[i] = "sparse"
			if i < c.FirstKDenseReplace {
				c.MLPLayerTypes[i] = "dense"
			}
		}
	}
	if err := c.Validate(); err != nil {
		return nil, err
	}
	return c, nil
}

func (c *Config) parseRope(r *cfgReader) error {
	// transformers 5 writes rope_parameters{rope_type, rope_theta, ...}; older checkpoints write
	// rope_theta at top level and rope_scaling{type|rope_type, ...}.
	key := "rope_parameters"
	p := r.object(key)
	if p == nil {
		key = "rope_scaling"
		p = r.object(key)
	}
	if r.err != nil {
		return r.err
	}
	pr := &cfgReader{m: p}
	if p == nil {
		pr.m = map[string]json.RawMessage{}
	}
	c.RopeTheta = r.float("rope_theta", 10000)
	c.RopeTheta = pr.float("rope_theta", c.RopeTheta)
	typ := pr.str("rope_type", pr.str("type", "default"))
	c.Rope = RopeScaling{Type: typ, Truncate: true}
	switch typ {
	case "default":
	case "yarn", "deepseek_yarn":
		c.Rope.Type = "yarn"
		c.Rope.Factor = pr.float("factor", 0)
		c.Rope.OriginalMaxPositionEmbeddings = pr.int("original_max_position_embeddings", c.MaxPositionEmbeddings)
		c.Rope.BetaFast = pr.float("beta_fast", 32)
		c.Rope.BetaSlow = pr.float("beta_slow", 1)
		// HF treats 0 as absent for the betas ("or 32").
		if c.Rope.BetaFast == 0 {
			c.Rope.BetaFast = 32
		}
		if c.Rope.BetaSlow == 0 {
			c.Rope.BetaSlow = 1
		}
		c.Rope.Mscale = pr.float("mscale", 0)
		c.Rope.MscaleAllDim = pr.float("mscale_all_dim", 0)
		c.Rope.AttentionFactor = pr.float("attention_factor", 0)
		c.Rope.Truncate = pr.bool("truncate", true)
		if !pr.has("factor") && c.Rope.OriginalMaxPositionEmbeddings > 0 {
			c.Rope.Factor = float64(c.MaxPositionEmbeddings) / float64(c.Rope.OriginalMaxPositionEmbeddings)
		}
	default:
		return errors.WithHint(fieldErr(key, "unsupported rope type %q", typ),
			"supported RoPE types: default, yarn")
	}
	if pr.err != nil {
		return errors.Wrapf(pr.err, "in %q", key)
	}
	if pr.has("partial_rotary_factor") && pr.float("partial_rotary_factor", 1) != 1 {
		return fieldErr(key, "partial_rotary_factor must be 1 (the rope slice is qk_rope_head_dim wide)")
	}
	return nil
}

func (c *Config) parseQuant(r *cfgReader) error {
	q := r.object("quantization_config")
	if r.err != nil {
		return r.err
	}
	if q == nil {
		return nil
	}
	qr := &cfgReader{m: q}
	qc := &QuantConfig{
		Method:           qr.str("quant_method", "fp8"),
		Fmt:              qr.str("fmt", "e4m3"),
		ActivationScheme: qr.str("activation_scheme", "dynamic"),
		ScaleFmt:         qr.str("scale_fmt", ""),
		WeightBlockSize:  [2]int{128, 128},
	}
	if qr.has("weight_block_size") {
		var bs []int
		if err := json.Unmarshal(q["weight_block_size"], &bs); err != nil || len(bs) != 2 {
			return errors.WithHint(fieldErr("quantization_config.weight_block_size", "want [rows, cols], got %s", q["weight_block_size"]),
				"TileRT reads DeepSeek-style FP8 checkpoints with weight_block_size [128, 128]")
		}
		qc.WeightBlockSize = [2]int{bs[0], bs[1]}
	}
	if qr.err != nil {
		return errors.Wrap(qr.err, "in \"quantization_config\"")
	}
	hint := "TileRT reads DeepSeek-style block FP8 checkpoints (quant_method fp8, fmt e4m3, weight_block_size [128, 128]); " +
		"use the official FP8 release or an unquantised (bf16) checkpoint"
	switch {
	case qc.Method != "fp8":
		return errors.WithHint(fieldErr("quantization_config.quant_method", "unsupported quantisation %q", qc.Method), hint)
	case qc.Fmt != "e4m3":
		return errors.WithHint(fieldErr("quantization_config.fmt", "unsupported FP8 format %q", qc.Fmt), hint)
	case qc.WeightBlockSize != [2]int{128, 128}:
		return errors.WithHint(fieldErr("quantization_config.weight_block_size", "unsupported block size %v", qc.WeightBlockSize[:]), hint)
	case qc.ScaleFmt != "" && qc.ScaleFmt != "float" && qc.ScaleFmt != "ue8m0":
		return errors.WithHint(fieldErr("quantization_config.scale_fmt", "unsupported scale format %q", qc.ScaleFmt), hint)
	}
	c.Quant = qc
	return nil
}

// parseIndexerTypes resolves GLM's per-layer indexer sharing exactly as HF does: explicit
// indexer_types, else index_topk_pattern ("FSS..."), else index_topk_freq/index_skip_topk_offset.
func (c *Config) parseIndexerTypes(r *cfgReader) error {
	if len(c.IndexerTypes) > 0 {
		return nil
	}
	if c.Family != GLMMoEDSA {
		c.IndexerTypes = make([]string, c.NumLayers)
		for i := range c.IndexerTypes {
			c.IndexerTypes[i] = "full"
		}
		return nil
	}
	if r.has("index_topk_pattern") {
		var pat string
		if err := json.Unmarshal(r.m["index_topk_pattern"], &pat); err == nil {
			for _, ch := range pat {
				switch ch {
				case 'F':
					c.IndexerTypes = append(c.IndexerTypes, "full")
				case 'S':
					c.IndexerTypes = append(c.IndexerTypes, "shared")
				default:
					return fieldErr("index_topk_pattern", "want only F and S characters, got %q", pat)
				}
			}
			return nil
		}
		c.IndexerTypes = r.strList("index_topk_pattern")
		return r.err
	}
	freq := max(r.int("index_topk_freq", 1), 1)
	off := r.int("index_skip_topk_offset", 2)
	c.IndexerTypes = make([]string, c.NumLayers)
	for i := range c.IndexerTypes {
		c.IndexerTypes[i] = "shared"
		if max(i-off+1, 0)%freq == 0 {
			c.IndexerTypes[i] = "full"
		}
	}
	return r.err
}

// checkUnsupported rejects config values that would silently change the math.
func (c *Config) checkUnsupported(r *cfgReader) error {
	type want struct {
		key, val string
	}
	for _, w := range []want{{"hidden_act", "silu"}, {"scoring_func", "sigmoid"}, {"topk_method", "noaux_tc"}} {
		if v := r.str(w.key, w.val); v != w.val {
			return errors.WithHint(fieldErr(w.key, "unsupported value %q", v),
				fmt.Sprintf("DeepSeek-V3.2 and GLM-5 use %s = %q", w.key, w.val))
		}
	}
	if r.bool("attention_bias", false) {
		return errors.WithHint(fieldErr("attention_bias", "attention biases are not supported"), "set attention_bias to false")
	}
	if r.bool("mlp_bias", false) {
		return errors.WithHint(fieldErr("mlp_bias", "MLP biases are not supported"), "set mlp_bias to false")
	}
	if v := r.int("moe_layer_freq", 1); v != 1 {
		return errors.WithHint(fieldErr("moe_layer_freq", "must be 1, got %d", v), "use mlp_layer_types to describe irregular layer patterns")
	}
	if r.has("num_key_value_heads") {
		if kv := r.int("num_key_value_heads", c.NumHeads); kv != c.NumHeads {
			return errors.WithHint(fieldErr("num_key_value_heads", "must equal num_attention_heads (%d) for MLA, got %d", c.NumHeads, kv),
				"set num_key_value_heads to num_attention_heads")
		}
	}
	return r.err
}

// Validate checks ranges and cross-field consistency. Errors name the config.json field.
func (c *Config) Validate() error {
	pos := []struct {
		key string
		v   int
	}{
		{"vocab_size", c.VocabSize}, {"hidden_size", c.HiddenSize}, {"intermediate_size", c.IntermediateSize},
		{"moe_intermediate_size", c.MoEIntermediateSize}, {"num_hidden_layers", c.NumLayers},
		{"num_attention_heads", c.NumHeads}, {"q_lora_rank", c.QLoraRank}, {"kv_lora_rank", c.KVLoraRank},
		{"qk_nope_head_dim", c.QKNopeHeadDim}, {"qk_rope_head_dim", c.QKRopeHeadDim}, {"v_head_dim", c.VHeadDim},
		{"num_experts_per_tok", c.NumExpertsPerTok}, {"n_group", c.NGroup}, {"topk_group", c.TopKGroup},
		{"index_n_heads", c.IndexNHeads}, {"index_head_dim", c.IndexHeadDim}, {"index_topk", c.IndexTopK},
		{"max_position_embeddings", c.MaxPositionEmbeddings},
	}
	for _, p := range pos {
		if p.v <= 0 {
			return errors.WithHint(fieldErr(p.key, "must be a positive integer, got %d", p.v),
				"fix the value in config.json (compare with the model's published config)")
		}
	}
	nonNeg := []struct {
		key string
		v   int
	}{
		{"n_routed_experts", c.NRoutedExperts}, {"n_shared_experts", c.NSharedExperts},
		{"first_k_dense_replace", c.FirstKDenseReplace}, {"num_nextn_predict_layers", c.NumNextNLayers},
	}
	for _, p := range nonNeg {
		if p.v < 0 {
			return fieldErr(p.key, "must be >= 0, got %d", p.v)
		}
	}
	if c.QKRopeHeadDim%2 != 0 {
		return fieldErr("qk_rope_head_dim", "must be even (RoPE rotates pairs), got %d", c.QKRopeHeadDim)
	}
	if c.IndexHeadDim < c.QKRopeHeadDim {
		return fieldErr("index_head_dim", "must be >= qk_rope_head_dim (%d): the indexer ropes its first qk_rope_head_dim dims, got %d",
			c.QKRopeHeadDim, c.IndexHeadDim)
	}
	if !(c.RMSNormEps > 0) {
		return fieldErr("rms_norm_eps", "must be > 0, got %g", c.RMSNormEps)
	}
	if !(c.RopeTheta > 0) {
		return fieldErr("rope_theta", "must be > 0, got %g", c.RopeTheta)
	}
	if c.Rope.Type == "yarn" {
		if !(c.Rope.Factor > 0) {
			return errors.WithHint(fieldErr("rope_scaling.factor", "yarn needs a factor > 0, got %g", c.Rope.Factor),
				"DeepSeek-V3.2 uses factor 40 with original_max_position_embeddings 4096")
		}
		if c.Rope.OriginalMaxPositionEmbeddings <= 0 {
			return fieldErr("rope_scaling.original_max_position_embeddings", "must be > 0, got %d", c.Rope.OriginalMaxPositionEmbeddings)
		}
	}
	if !c.RopeInterleave {
		return errors.WithHint(fieldErr("rope_interleave", "non-interleaved main RoPE is not supported"),
			"DeepSeek-V3.2 and GLM-5 use interleaved MLA RoPE; remove the field or set it to true")
	}
	if !(c.RoutedScalingFactor > 0) {
		return fieldErr("routed_scaling_factor", "must be > 0, got %g", c.RoutedScalingFactor)
	}
	if len(c.MLPLayerTypes) != c.NumLayers {
		return fieldErr("mlp_layer_types", "has %d entries, want num_hidden_layers = %d", len(c.MLPLayerTypes), c.NumLayers)
	}
	anyMoE := false
	for i, t := range c.MLPLayerTypes {
		switch t {
		case "dense":
		case "sparse":
			anyMoE = true
		default:
			return fieldErr("mlp_layer_types", "entry %d is %q, want \"dense\" or \"sparse\"", i, t)
		}
	}
	if c.NumNextNLayers > 0 && c.NumLayers >= c.FirstKDenseReplace {
		anyMoE = true
	}
	if anyMoE {
		if c.NRoutedExperts <= 0 {
			return fieldErr("n_routed_experts", "must be > 0 when MoE layers exist, got %d", c.NRoutedExperts)
		}
		if c.NumExpertsPerTok > c.NRoutedExperts {
			return fieldErr("num_experts_per_tok", "%d exceeds n_routed_experts %d", c.NumExpertsPerTok, c.NRoutedExperts)
		}
		if c.NRoutedExperts%c.NGroup != 0 {
			return fieldErr("n_group", "%d does not divide n_routed_experts %d", c.NGroup, c.NRoutedExperts)
		}
		if c.NRoutedExperts/c.NGroup < 2 {
			return fieldErr("n_group", "each group needs >= 2 experts (group score = sum of its top 2), got %d experts in %d groups",
				c.NRoutedExperts, c.NGroup)
		}
		if c.TopKGroup > c.NGroup {
			return fieldErr("topk_group", "%d exceeds n_group %d", c.TopKGroup, c.NGroup)
		}
		if c.NumExpertsPerTok > c.TopKGroup*(c.NRoutedExperts/c.NGroup) {
			return fieldErr("num_experts_per_tok", "%d exceeds the experts in the kept groups (topk_group %d x %d per group)",
				c.NumExpertsPerTok, c.TopKGroup, c.NRoutedExperts/c.NGroup)
		}
	}
	if len(c.IndexerTypes) != c.NumLayers {
		return fieldErr("indexer_types", "has %d entries, want num_hidden_layers = %d", len(c.IndexerTypes), c.NumLayers)
	}
	for i, t := range c.IndexerTypes {
		switch {
		case t == "full":
		case t == "shared" && i > 0:
		case t == "shared":
			return fieldErr("indexer_types", "layer 0 cannot be \"shared\": no previous layer computes a top-k")
		default:
			return fieldErr("indexer_types", "entry %d is %q, want \"full\" or \"shared\"", i, t)
		}
	}
	if c.Family == DeepSeekV32 {
		for i, t := range c.IndexerTypes {
			if t != "full" {
				return fieldErr("indexer_types", "entry %d is %q: deepseek_v32 runs the indexer in every layer", i, t)
			}
		}
	}
	if c.BOS < -1 || c.BOS >= c.VocabSize {
		return fieldErr("bos_token_id", "%d is outside the vocabulary (vocab_size %d)", c.BOS, c.VocabSize)
	}
	if len(c.EOS) == 0 {
		return errors.WithHint(fieldErr("eos_token_id", "missing"), "set eos_token_id to the end-of-sequence token id(s)")
	}
	for _, e := range c.EOS {
		if e < 0 || e >= c.VocabSize {
			return fieldErr("eos_token_id", "%d is outside the vocabulary (vocab_size %d)", e, c.VocabSize)
		}
	}
	return nil
}

// String summarises the config for logs.
func (c *Config) String() string {
	return fmt.Sprintf("%s: %d layers (+%d MTP), hidden %d, %d heads, q_lora %d, kv_lora %d, %d experts (top %d, %d groups keep %d), index topk %d",
		c.Family, c.NumLayers, c.NumNextNLayers, c.HiddenSize, c.NumHeads, c.QLoraRank, c.KVLoraRank,
		c.NRoutedExperts, c.NumExpertsPerTok, c.NGroup, c.TopKGroup, c.IndexTopK)
}
