package model

import (
	"fmt"
	"strings"
)

// Global tensor names of the HF checkpoints.
const (
	EmbedTokensName = "model.embed_tokens.weight"
	FinalNormName   = "model.norm.weight"
	LMHeadName      = "lm_head.weight"
)

// ScaleSuffix is appended (in place of ".weight") to name an FP8 weight's block scales.
const ScaleSuffix = ".weight_scale_inv"

// ScaleName gives the block-scale tensor name of an FP8 weight ("x.weight" -> "x.weight_scale_inv").
func ScaleName(weight string) string {
	return strings.TrimSuffix(weight, ".weight") + ScaleSuffix
}

// IsScaleName reports whether name is a block-scale tensor.
func IsScaleName(name string) bool { return strings.HasSuffix(name, ScaleSuffix) }

// LayerNames holds the HF tensor names of decoder block i (MTP blocks included). Fields that do not
// apply to a block (dense MLP names on a MoE block, MTP names on a main block) are still filled;
// use Config.IsMoELayer / IsMTPLayer / HasIndexer to decide which exist.
type LayerNames struct {
	Index                   int
	Prefix                  string // "model.layers.{i}."
	InputNorm, PostAttnNorm string

	QAProj, QANorm, QBProj           string
	KVAProj, KVANorm, KVBProj, OProj string

	IdxWQB, IdxWK, IdxKNormWeight, IdxKNormBias, IdxWeightsProj string

	// Dense MLP.
	GateProj, UpProj, DownProj string
	// MoE: router (weight + score-correction bias) and shared expert(s).
	Router, RouterBias               string
	SharedGate, SharedUp, SharedDown string

	// MTP block extras.
	MTPEmbed, ENorm, HNorm, EHProj, SharedHeadNorm, SharedHeadHead string
}

// Layer returns the tensor names of decoder block i.
func Layer(i int) LayerNames {
	p := fmt.Sprintf("model.layers.%d.", i)
	a := p + "self_attn."
	x := a + "indexer."
	m := p + "mlp."
	return LayerNames{
		Index: i, Prefix: p,
		InputNorm:    p + "input_layernorm.weight",
		PostAttnNorm: p + "post_attention_layernorm.weight",

		QAProj: a + "q_a_proj.weight", QANorm: a + "q_a_layernorm.weight", QBProj: a + "q_b_proj.weight",
		KVAProj: a + "kv_a_proj_with_mqa.weight", KVANorm: a + "kv_a_layernorm.weight", KVBProj: a + "kv_b_proj.weight",
		OProj: a + "o_proj.weight",

		IdxWQB: x + "wq_b.weight", IdxWK: x + "wk.weight", IdxKNormWeight: x + "k_norm.weight",
		IdxKNormBias: x + "k_norm.bias", IdxWeightsProj: x + "weights_proj.weight",

		GateProj: m + "gate_proj.weight", UpProj: m + "up_proj.weight", DownProj: m + "down_proj.weight",
		Router: m + "gate.weight", RouterBias: m + "gate.e_score_correction_bias",
		SharedGate: m + "shared_experts.gate_proj.weight", SharedUp: m + "shared_experts.up_proj.weight",
		SharedDown: m + "shared_experts.down_proj.weight",

		MTPEmbed: p + "embed_tokens.weight", ENorm: p + "enorm.weight", HNorm: p + "hnorm.weight",
		EHProj: p + "eh_proj.weight", SharedHeadNorm: p + "shared_head.norm.weight",
		SharedHeadHead: p + "shared_head.head.weight",
	}
}

// Expert returns the names of routed expert e's projections in block i.
func (l LayerNames) Expert(e int) (gate, up, down string) {
	p := fmt.Sprintf("%smlp.experts.%d.", l.Prefix, e)
	return p + "gate_proj.weight", p + "up_proj.weight", p + "down_proj.weight"
}

// Storage says how the real checkpoints store a tensor.
type Storage int

const (
	// StoreBF16: kept in bf16 (norms, router, indexer weights_proj, embeddings, heads, eh_proj).
	StoreBF16 Storage = iota
	// StoreF32: kept in float32 (the router's e_score_correction_bias).
	StoreF32
	// StoreFP8: a linear weight quantised to e4m3 with 128x128 float32 block scales
	// (weight_scale_inv) when the config has a quantization_config, bf16 otherwise.
	StoreFP8
)

// TensorSpec is one logical weight of a model: its name, [rows, cols] (or [n]) shape, and storage.
type TensorSpec struct {
	Name    string
	Shape   []int
	Storage Storage
}

// Specs lists every logical weight of the model (scale tensors excluded) in a stable order:
// embeddings, blocks 0..NumAllLayers()-1 (MTP blocks last), final norm, lm_head.
func Specs(c *Config) []TensorSpec {
	h := c.HiddenSize
	var out []TensorSpec
	add := func(name string, st Storage, shape ...int) {
		out = append(out, TensorSpec{Name: name, Shape: shape, Storage: st})
	}
	add(EmbedTokensName, StoreBF16, c.VocabSize, h)
	for i := range c.NumAllLayers() {
		l := Layer(i)
		if c.IsMTPLayer(i) {
			add(l.MTPEmbed, StoreBF16, c.VocabSize, h)
			add(l.ENorm, StoreBF16, h)
			add(l.HNorm, StoreBF16, h)
			add(l.EHProj, StoreBF16, h, 2*h)
		}
		add(l.InputNorm, StoreBF16, h)
		add(l.QAProj, StoreFP8, c.QLoraRank, h)
		add(l.QANorm, StoreBF16, c.QLoraRank)
		add(l.QBProj, StoreFP8, c.NumHeads*c.QKHeadDim(), c.QLoraRank)
		add(l.KVAProj, StoreFP8, c.KVLoraRank+c.QKRopeHeadDim, h)
		add(l.KVANorm, StoreBF16, c.KVLoraRank)
		add(l.KVBProj, StoreFP8, c.NumHeads*(c.QKNopeHeadDim+c.VHeadDim), c.KVLoraRank)
		add(l.OProj, StoreFP8, h, c.NumHeads*c.VHeadDim)
		if c.HasIndexer(i) {
			add(l.IdxWQB, StoreFP8, c.IndexNHeads*c.IndexHeadDim, c.QLoraRank)
			add(l.IdxWK, StoreFP8, c.IndexHeadDim, h)
			add(l.IdxKNormWeight, StoreBF16, c.IndexHeadDim)
			add(l.IdxKNormBias, StoreBF16, c.IndexHeadDim)
			add(l.IdxWeightsProj, StoreBF16, c.IndexNHeads, h)
		}
		add(l.PostAttnNorm, StoreBF16, h)
		if c.IsMoELayer(i) {
			add(l.Router, StoreBF16, c.NRoutedExperts, h)
			add(l.RouterBias, StoreF32, c.NRoutedExperts)
			for e := range c.NRoutedExperts {
				g, u, d := l.Expert(e)
				add(g, StoreFP8, c.MoEIntermediateSize, h)
				add(u, StoreFP8, c.MoEIntermediateSize, h)
				add(d, StoreFP8, h, c.MoEIntermediateSize)
			}
			if c.NSharedExperts > 0 {
				si := c.MoEIntermediateSize * c.NSharedExperts
				add(l.SharedGate, StoreFP8, si, h)
				add(l.SharedUp, StoreFP8, si, h)
				add(l.SharedDown, StoreFP8, h, si)
			}
		} else {
			add(l.GateProj, StoreFP8, c.IntermediateSize, h)
			add(l.UpProj, StoreFP8, c.IntermediateSize, h)
			add(l.DownProj, StoreFP8, h, c.IntermediateSize)
		}
		if c.IsMTPLayer(i) {
			add(l.SharedHeadNorm, StoreBF16, h)
			add(l.SharedHeadHead, StoreBF16, c.VocabSize, h)
		}
	}
	add(FinalNormName, StoreBF16, h)
	if !c.TieWordEmbeddings {
		add(LMHeadName, StoreBF16, c.VocabSize, h)
	}
	return out
}

// ExpectedShapes maps every logical weight name (scale tensors excluded) to its shape.
func ExpectedShapes(c *Config) map[string][]int {
	specs := Specs(c)
	m := make(map[string][]int, len(specs))
	for _, s := range specs {
		m[s.Name] = s.Shape
	}
	return m
}

// ScaleShape is the block-scale grid of an FP8 weight of shape [rows, cols] (partial blocks count).
func ScaleShape(shape []int) []int {
	const b = 128
	return []int{(shape[0] + b - 1) / b, (shape[1] + b - 1) / b}
}

// StoredDType is the safetensors dtype the real checkpoints use for the spec under c.
func (s TensorSpec) StoredDType(c *Config) string {
	switch {
	case s.Storage == StoreFP8 && c.Quant != nil:
		return "F8_E4M3"
	case s.Storage == StoreF32:
		return "F32"
	default:
		return "BF16"
	}
}

// Quantized reports whether the spec is stored as FP8 with a weight_scale_inv companion under c.
func (s TensorSpec) Quantized(c *Config) bool { return s.Storage == StoreFP8 && c.Quant != nil }
