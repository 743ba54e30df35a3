// Package synth writes deterministic synthetic HF checkpoints of the DeepSeek-V3.2 and GLM-5
// families: real tensor names, dtypes and file layout, random weights scaled so activations stay
// O(1), a synthetic byte-level BPE tokenizer. The same preset and seed give the same bytes on any
// machine.
package synth

import (
	"sort"

	"github.com/cockroachdb/errors"

	"github.com/tilert-go/tilert/model"
)

// Preset describes one synthetic model.
type Preset struct {
	Name        string
	Family      model.Family
	Description string

	VocabSize, HiddenSize, IntermediateSize, MoEIntermediateSize int
	NumLayers, FirstKDenseReplace, NumNextN                      int
	NumHeads, QLoraRank, KVLoraRank, QKNopeHeadDim               int
	QKRopeHeadDim, VHeadDim                                      int
	NRoutedExperts, NSharedExperts, NumExpertsPerTok             int
	NGroup, TopKGroup                                            int
	IndexNHeads, IndexHeadDim, IndexTopK                         int
	MaxPositionEmbeddings                                        int
	RMSNormEps                                                   float64
	RopeTheta                                                    float64
	// Yarn: write DeepSeek-V3.2's YaRN rope_scaling (factor 40 over 4096 positions).
	Yarn bool

	// TokenizerVocab is the synthetic tokenizer's size (<= VocabSize; real checkpoints also pad
	// the embedding past the tokenizer).
	TokenizerVocab int
	// MaxShardBytes bounds a shard's data; at least two shards are always written.
	MaxShardBytes int64
}

func deepseekSpecials() []string {
	return []string{
		"<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "<｜▁pad▁｜>",
		"<｜User｜>", "<｜Assistant｜>", "<think>", "</think>",
		"<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>", "<｜tool▁call▁begin｜>", "<｜tool▁call▁end｜>",
		"<｜tool▁outputs▁begin｜>", "<｜tool▁outputs▁end｜>", "<｜tool▁output▁begin｜>", "<｜tool▁output▁end｜>",
		"<｜tool▁sep｜>", "<｜fim▁hole｜>", "<｜fim▁begin｜>", "<｜fim▁end｜>",
	}
}

func glmSpecials() []string {
	return []string{
		"<|endoftext|>", "[MASK]", "[gMASK]", "[sMASK]", "<sop>", "<eop>",
		"<|system|>", "<|user|>", "<|assistant|>", "<|observation|>",
		"<think>", "</think>", "<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>",
		"<arg_key>", "</arg_key>", "<arg_value>", "</arg_value>", "/nothink",
	}
}

var presets = map[string]Preset{
	// Tiny DeepSeek-V3.2: CPU/CI sized. kv_lora 512, rope 64 and index_head_dim 128 as in the real
	// model (the vLLM cache layouts depend on them); hidden 160, q_lora 96, moe_inter 96 and
	// intermediate 288 are not multiples of 128 so partial FP8 blocks are exercised. One dense layer,
	// two MoE layers, grouped routing (4 groups, keep 2), index_topk 32, YaRN, one MTP layer.
	"deepseek-v3.2-tiny": {
		Name: "deepseek-v3.2-tiny", Family: model.DeepSeekV32,
		Description: "tiny DeepSeek-V3.2 (CI): 3 layers (1 dense + 2 MoE) + MTP, hidden 160, 16 experts in 4 groups",
		VocabSize:   1024, HiddenSize: 160, IntermediateSize: 288, MoEIntermediateSize: 96,
		NumLayers: 3, FirstKDenseReplace: 1, NumNextN: 1,
		NumHeads: 4, QLoraRank: 96, KVLoraRank: 512, QKNopeHeadDim: 32, QKRopeHeadDim: 64, VHeadDim: 32,
		NRoutedExperts: 16, NSharedExperts: 1, NumExpertsPerTok: 4, NGroup: 4, TopKGroup: 2,
		IndexNHeads: 16, IndexHeadDim: 128, IndexTopK: 32, // 16 heads: an all-zero ReLU score (a top-k tie torch breaks arbitrarily) is rare
		MaxPositionEmbeddings: 163840, RMSNormEps: 1e-6, RopeTheta: 10000, Yarn: true,
		TokenizerVocab: 1024, MaxShardBytes: 2 << 20,
	},
	// Tiny GLM-5: plain top-k routing (n_group 1), no YaRN, both RoPEs interleaved, eps 1e-5,
	// qk_head_dim (nope+rope) 128 distinct from v_head_dim.
	"glm-5-tiny": {
		Name: "glm-5-tiny", Family: model.GLMMoEDSA,
		Description: "tiny GLM-5 (CI): 3 layers (1 dense + 2 MoE) + MTP, hidden 288, 16 experts plain top-4",
		VocabSize:   1024, HiddenSize: 288, IntermediateSize: 416, MoEIntermediateSize: 80,
		NumLayers: 3, FirstKDenseReplace: 1, NumNextN: 1,
		NumHeads: 4, QLoraRank: 160, KVLoraRank: 512, QKNopeHeadDim: 64, QKRopeHeadDim: 64, VHeadDim: 48,
		NRoutedExperts: 16, NSharedExperts: 1, NumExpertsPerTok: 4, NGroup: 1, TopKGroup: 1,
		IndexNHeads: 16, IndexHeadDim: 128, IndexTopK: 32, // 16 heads: an all-zero ReLU score (a top-k tie torch breaks arbitrarily) is rare
		MaxPositionEmbeddings: 202752, RMSNormEps: 1e-5, RopeTheta: 1e6,
		TokenizerVocab: 1024, MaxShardBytes: 2 << 20,
	},
	// Real DeepSeek-V3.2 layer dimensions, two dense layers (first_k_dense_replace 3 as in the real
	// config), no MTP layer (it would bring its own 1.85 GB embedding and head and double the size):
	// about 4.9 GB, for the converter benchmark.
	"deepseek-v3.2-2layer": {
		Name: "deepseek-v3.2-2layer", Family: model.DeepSeekV32,
		Description: "DeepSeek-V3.2 real dimensions, 2 dense layers, no MTP (~4.9 GB, converter benchmark)",
		VocabSize:   129280, HiddenSize: 7168, IntermediateSize: 18432, MoEIntermediateSize: 2048,
		NumLayers: 2, FirstKDenseReplace: 3, NumNextN: 0,
		NumHeads: 128, QLoraRank: 1536, KVLoraRank: 512, QKNopeHeadDim: 128, QKRopeHeadDim: 64, VHeadDim: 128,
		NRoutedExperts: 256, NSharedExperts: 1, NumExpertsPerTok: 8, NGroup: 8, TopKGroup: 4,
		IndexNHeads: 64, IndexHeadDim: 128, IndexTopK: 2048,
		MaxPositionEmbeddings: 163840, RMSNormEps: 1e-6, RopeTheta: 10000, Yarn: true,
		TokenizerVocab: 4096, MaxShardBytes: 1 << 30,
	},
	// Real DeepSeek-V3.2 dimensions with one dense and one MoE layer (all 256 routed experts,
	// grouped routing 8/4, top-8, one shared expert), no MTP: about 16 GB, most of it experts, so
	// the routed-expert path is measured at real scale. Generate it where disk and cores are fast.
	"deepseek-v3.2-moe": {
		Name: "deepseek-v3.2-moe", Family: model.DeepSeekV32,
		Description: "DeepSeek-V3.2 real dimensions, 1 dense + 1 MoE layer (256 experts), no MTP (~16 GB, GPU benchmark)",
		VocabSize:   129280, HiddenSize: 7168, IntermediateSize: 18432, MoEIntermediateSize: 2048,
		NumLayers: 2, FirstKDenseReplace: 1, NumNextN: 0,
		NumHeads: 128, QLoraRank: 1536, KVLoraRank: 512, QKNopeHeadDim: 128, QKRopeHeadDim: 64, VHeadDim: 128,
		NRoutedExperts: 256, NSharedExperts: 1, NumExpertsPerTok: 8, NGroup: 8, TopKGroup: 4,
		IndexNHeads: 64, IndexHeadDim: 128, IndexTopK: 2048,
		MaxPositionEmbeddings: 163840, RMSNormEps: 1e-6, RopeTheta: 10000, Yarn: true,
		TokenizerVocab: 4096, MaxShardBytes: 1 << 30,
	},
}

// Names lists the presets, sorted.
func Names() []string {
	ns := make([]string, 0, len(presets))
	for n := range presets {
		ns = append(ns, n)
	}
	sort.Strings(ns)
	return ns
}

// Lookup returns a preset by name.
func Lookup(name string) (Preset, error) {
	p, ok := presets[name]
	if !ok {
		return Preset{}, errors.WithHint(errors.Newf("unknown synthetic preset %q", name),
			"available presets: "+joinNames())
	}
	return p, nil
}

func joinNames() string {
	s := ""
	for i, n := range Names() {
		if i > 0 {
			s += ", "
		}
		s += n
	}
	return s
}

func (p Preset) specials() []string {
	if p.Family == model.GLMMoEDSA {
		return glmSpecials()
	}
	return deepseekSpecials()
}
