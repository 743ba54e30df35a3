package synth

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math"
	"math/bits"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"

	"github.com/cockroachdb/errors"

	"github.com/tilert-go/tilert/model"
	"github.com/tilert-go/tilert/numeric"
	"github.com/tilert-go/tilert/safetensors"
	"github.com/tilert-go/tilert/tokenizer"
)

// Write generates preset into outDir (which must not exist or be empty): config.json,
// generation_config.json, tokenizer.json, tokenizer_config.json, >= 2 safetensors shards and
// model.safetensors.index.json. It writes into outDir+".partial" and renames at the end, so an
// interrupted run never leaves a complete-looking checkpoint. progress (may be nil) gets the
// tensor bytes written so far and the total.
func Write(preset, outDir string, seed int64, progress func(done, total int64)) error {
	p, err := Lookup(preset)
	if err != nil {
		return err
	}
	if err := checkOutDir(outDir); err != nil {
		return err
	}
	tmp := strings.TrimRight(outDir, string(os.PathSeparator)) + ".partial"
	if err := os.RemoveAll(tmp); err != nil {
		return errors.Wrapf(err, "synth: remove stale %s", tmp)
	}
	if err := os.MkdirAll(tmp, 0o755); err != nil {
		return errors.Wrapf(err, "synth: create %s", tmp)
	}
	ok := false
	defer func() {
		if !ok {
			os.RemoveAll(tmp)
		}
	}()
	if err := writeAll(p, tmp, seed, progress); err != nil {
		return err
	}
	if err := safetensors.SyncDir(tmp); err != nil {
		return err
	}
	if err := os.Remove(outDir); err != nil && !os.IsNotExist(err) {
		return errors.Wrapf(err, "synth: replace %s", outDir)
	}
	if err := os.Rename(tmp, outDir); err != nil {
		return errors.Wrapf(err, "synth: rename %s to %s", tmp, outDir)
	}
	ok = true
	return safetensors.SyncDir(filepath.Dir(filepath.Clean(outDir)))
}

func checkOutDir(dir string) error {
	ents, err := os.ReadDir(dir)
	if os.IsNotExist(err) {
		return nil
	}
	if err != nil {
		return errors.Wrapf(err, "synth: output %s", dir)
	}
	if len(ents) > 0 {
		return errors.WithHint(errors.Newf("synth: output directory %s is not empty", dir),
			"choose a new --out directory or remove the existing one")
	}
	return nil
}

// Built is a preset's resolved config and tokenizer files (everything but the weights).
type Built struct {
	Preset          Preset
	Config          *model.Config
	ConfigJSON      []byte
	TokenizerJSON   []byte
	TokenizerConfig []byte
	GenerationJSON  []byte
}

// Build resolves a preset: builds its tokenizer (to learn the special-token ids) and its
// config.json, validated by model.ParseConfig.
func Build(p Preset, seed int64) (*Built, error) {
	specials := p.specials()
	tok, err := tokenizer.BuildSynthetic(p.TokenizerVocab, specials, seed)
	if err != nil {
		return nil, errors.Wrapf(err, "synth %s: tokenizer", p.Name)
	}
	ids, err := specialIDs(tok)
	if err != nil {
		return nil, errors.Wrapf(err, "synth %s: tokenizer", p.Name)
	}
	for _, sp := range specials {
		if _, ok := ids[sp]; !ok {
			return nil, errors.Newf("synth %s: tokenizer has no special token %q", p.Name, sp)
		}
	}
	b := &Built{Preset: p, TokenizerJSON: tok}
	cfg := baseConfig(p)
	tc := map[string]any{
		"add_eos_token": false, "clean_up_tokenization_spaces": false, "legacy": true,
		"model_max_length": p.MaxPositionEmbeddings, "tokenizer_class": "PreTrainedTokenizerFast",
	}
	gen := map[string]any{"_from_model_config": true, "do_sample": true, "top_p": 0.95}
	switch p.Family {
	case model.DeepSeekV32:
		bos, eos := ids["<｜begin▁of▁sentence｜>"], ids["<｜end▁of▁sentence｜>"]
		cfg["bos_token_id"], cfg["eos_token_id"] = bos, eos
		tc["add_bos_token"] = true
		tc["bos_token"], tc["eos_token"], tc["pad_token"] = "<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "<｜▁pad▁｜>"
		tc["chat_template"] = deepseekTemplate
		gen["bos_token_id"], gen["eos_token_id"], gen["temperature"] = bos, eos, 0.6
	case model.GLMMoEDSA:
		eos := []int{ids["<|endoftext|>"], ids["<|user|>"], ids["<|observation|>"]}
		cfg["eos_token_id"], cfg["pad_token_id"] = eos, ids["<|endoftext|>"]
		tc["add_bos_token"] = false
		tc["eos_token"], tc["pad_token"] = "<|endoftext|>", "<|endoftext|>"
		tc["chat_template"] = glmTemplate
		gen["eos_token_id"], gen["pad_token_id"], gen["temperature"] = eos, ids["<|endoftext|>"], 1.0
	}
	if b.ConfigJSON, err = marshal(cfg); err != nil {
		return nil, err
	}
	if b.TokenizerConfig, err = marshal(tc); err != nil {
		return nil, err
	}
	if b.GenerationJSON, err = marshal(gen); err != nil {
		return nil, err
	}
	if b.Config, err = model.ParseConfig(b.ConfigJSON); err != nil {
		return nil, errors.Wrapf(err, "synth %s: generated config is invalid", p.Name)
	}
	return b, nil
}

const deepseekTemplate = "{{ bos_token }}{% for m in messages %}{% if m['role'] == 'system' %}{{ m['content'] }}" +
	"{% elif m['role'] == 'user' %}<｜User｜>{{ m['content'] }}{% elif m['role'] == 'assistant' %}<｜Assistant｜></think>" +
	"{{ m['content'] }}<｜end▁of▁sentence｜>{% endif %}{% endfor %}{% if add_generation_prompt %}<｜Assistant｜></think>{% endif %}"

const glmTemplate = "[gMASK]<sop>{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}{% endfor %}" +
	"{% if add_generation_prompt %}<|assistant|>\n<think></think>{% endif %}"

func marshal(v any) ([]byte, error) {
	// encoding/json sorts map keys, so the bytes are deterministic.
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return nil, errors.Wrap(err, "synth: encode json")
	}
	return append(b, '\n'), nil
}

func specialIDs(tokJSON []byte) (map[string]int, error) {
	var t struct {
		Added []struct {
			ID      int    `json:"id"`
			Content string `json:"content"`
		} `json:"added_tokens"`
	}
	if err := json.Unmarshal(tokJSON, &t); err != nil {
		return nil, errors.Wrap(err, "parse tokenizer.json")
	}
	m := map[string]int{}
	for _, a := range t.Added {
		m[a.Content] = a.ID
	}
	return m, nil
}

func baseConfig(p Preset) map[string]any {
	c := map[string]any{
		"model_type": string(p.Family), "vocab_size": p.VocabSize, "hidden_size": p.HiddenSize,
		"intermediate_size": p.IntermediateSize, "moe_intermediate_size": p.MoEIntermediateSize,
		"num_hidden_layers": p.NumLayers, "num_attention_heads": p.NumHeads, "num_key_value_heads": p.NumHeads,
		"n_shared_experts": p.NSharedExperts, "n_routed_experts": p.NRoutedExperts, "routed_scaling_factor": 2.5,
		"kv_lora_rank": p.KVLoraRank, "q_lora_rank": p.QLoraRank, "qk_rope_head_dim": p.QKRopeHeadDim,
		"v_head_dim": p.VHeadDim, "qk_nope_head_dim": p.QKNopeHeadDim, "n_group": p.NGroup, "topk_group": p.TopKGroup,
		"num_experts_per_tok": p.NumExpertsPerTok, "norm_topk_prob": true, "hidden_act": "silu",
		"max_position_embeddings": p.MaxPositionEmbeddings, "initializer_range": 0.02, "rms_norm_eps": p.RMSNormEps,
		"use_cache": true, "tie_word_embeddings": false, "attention_bias": false, "attention_dropout": 0.0,
		"index_topk": p.IndexTopK, "index_head_dim": p.IndexHeadDim, "index_n_heads": p.IndexNHeads,
		"first_k_dense_replace": p.FirstKDenseReplace, "num_nextn_predict_layers": p.NumNextN,
		"moe_layer_freq": 1, "scoring_func": "sigmoid", "topk_method": "noaux_tc", "ep_size": 1,
		"dtype": "bfloat16",
		"quantization_config": map[string]any{
			"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8", "weight_block_size": []int{128, 128},
		},
	}
	switch p.Family {
	case model.DeepSeekV32:
		c["architectures"] = []string{"DeepseekV32ForCausalLM"}
		// The released DeepSeek-V3.2 config uses the pre-transformers-5 spelling.
		c["rope_theta"] = p.RopeTheta
	case model.GLMMoEDSA:
		c["architectures"] = []string{"GlmMoeDsaForCausalLM"}
		c["rope_interleave"] = true
		c["indexer_rope_interleave"] = true
	}
	if p.Yarn {
		c["rope_scaling"] = map[string]any{
			"type": "yarn", "factor": 40, "original_max_position_embeddings": 4096,
			"beta_fast": 32, "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 1.0,
		}
	} else {
		c["rope_parameters"] = map[string]any{"rope_type": "default", "rope_theta": p.RopeTheta}
	}
	return c
}

// item is one stored tensor of the checkpoint.
type item struct {
	info  safetensors.TensorInfo
	spec  model.TensorSpec
	scale bool // the weight_scale_inv of the previous item
	init  initKind
}

type initKind struct {
	key    string  // RNG stream name (MTP copies of the embedding/head reuse the main one's)
	std    float32 // of the random part
	center float32 // added to the random part (1 for norm weights)
}

// Plan lists the stored tensors (scales right after their weights) and the shard of each.
type Plan struct {
	items  []item
	shard  []int
	shards int
	Total  int64 // tensor data bytes
}

const headStd = 4

func initFor(c *model.Config, s model.TensorSpec) initKind {
	n := s.Name
	switch {
	case strings.HasSuffix(n, "norm.weight") || strings.HasSuffix(n, "layernorm.weight"):
		return initKind{key: n, std: 0.1, center: 1}
	case strings.HasSuffix(n, "k_norm.bias"):
		return initKind{key: n, std: 0.1}
	case strings.HasSuffix(n, "e_score_correction_bias"):
		return initKind{key: n, std: 0.02}
	case n == model.EmbedTokensName:
		return initKind{key: n, std: 1}
	case strings.HasSuffix(n, ".embed_tokens.weight"): // MTP copy of the embedding
		return initKind{key: model.EmbedTokensName, std: 1}
	// The heads are scaled so logits spread like a trained model's (std about 4): with the
	// flatter logits of a plain 1/sqrt(fan_in) init, fp8 cache noise flips the argmax far more
	// often than it does on real checkpoints, and serving-mode checks would measure the init.
	case n == model.LMHeadName:
		return initKind{key: n, std: float32(headStd / math.Sqrt(float64(c.HiddenSize)))}
	case strings.HasSuffix(n, "shared_head.head.weight"): // MTP copy of the head
		return initKind{key: model.LMHeadName, std: float32(headStd / math.Sqrt(float64(c.HiddenSize)))}
	}
	fanIn := s.Shape[len(s.Shape)-1]
	return initKind{key: n, std: float32(1 / math.Sqrt(float64(fanIn)))}
}

// MakePlan lays out the checkpoint of a resolved preset.
func MakePlan(b *Built) *Plan {
	c := b.Config
	pl := &Plan{}
	for _, s := range model.Specs(c) {
		dt := safetensors.DType(s.StoredDType(c))
		shape := []int64{}
		n := int64(1)
		for _, d := range s.Shape {
			shape = append(shape, int64(d))
			n *= int64(d)
		}
		pl.items = append(pl.items, item{
			info: safetensors.TensorInfo{Name: s.Name, DType: dt, Shape: shape, End: n * int64(dt.Size())},
			spec: s, init: initFor(c, s),
		})
		if s.Quantized(c) {
			ss := model.ScaleShape(s.Shape)
			pl.items = append(pl.items, item{
				info:  safetensors.TensorInfo{Name: model.ScaleName(s.Name), DType: safetensors.F32, Shape: []int64{int64(ss[0]), int64(ss[1])}, End: int64(ss[0]*ss[1]) * 4},
				spec:  s,
				scale: true,
			})
		}
	}
	for _, it := range pl.items {
		pl.Total += it.info.End
	}
	// Greedy: a new shard starts when the next weight (with its scale) would overflow the limit,
	// which is at most half the data so there are always >= 2 shards. A tensor larger than the
	// limit gets a shard of its own, as in real checkpoints.
	limit := min(b.Preset.MaxShardBytes, (pl.Total+1)/2)
	pl.shard = make([]int, len(pl.items))
	cur, size := 0, int64(0)
	for i, it := range pl.items {
		n := it.info.End
		if !it.scale && i+1 < len(pl.items) && pl.items[i+1].scale {
			n += pl.items[i+1].info.End
		}
		if !it.scale && size > 0 && size+n > limit {
			cur++
			size = 0
		}
		pl.shard[i] = cur
		size += it.info.End
	}
	pl.shards = cur + 1
	return pl
}

func shardName(i, n int) string { return fmt.Sprintf("model-%05d-of-%05d.safetensors", i+1, n) }

func writeAll(p Preset, dir string, seed int64, progress func(done, total int64)) error {
	b, err := Build(p, seed)
	if err != nil {
		return err
	}
	files := []struct {
		name string
		data []byte
	}{
		{"config.json", b.ConfigJSON}, {"generation_config.json", b.GenerationJSON},
		{"tokenizer.json", b.TokenizerJSON}, {"tokenizer_config.json", b.TokenizerConfig},
	}
	for _, f := range files {
		if err := writeFileSync(filepath.Join(dir, f.name), f.data); err != nil {
			return err
		}
	}
	pl := MakePlan(b)
	if pl.shards < 2 {
		return errors.Newf("synth %s: only %d shard(s) planned, want >= 2", p.Name, pl.shards)
	}
	g := &generator{seed: seed, progress: progress, total: pl.Total}
	weightMap := map[string]string{}
	for sh := range pl.shards {
		var infos []safetensors.TensorInfo
		var items []item
		for i, it := range pl.items {
			if pl.shard[i] == sh {
				infos = append(infos, it.info)
				items = append(items, it)
				weightMap[it.info.Name] = shardName(sh, pl.shards)
			}
		}
		path := filepath.Join(dir, shardName(sh, pl.shards))
		w, err := safetensors.Create(path, infos, map[string]string{"format": "pt"})
		if err != nil {
			return err
		}
		if err := g.writeShard(w, items); err != nil {
			w.Abort()
			return errors.Wrapf(err, "synth: write %s", path)
		}
		if err := w.Close(); err != nil {
			return err
		}
	}
	return safetensors.WriteIndex(dir, weightMap, pl.Total)
}

func writeFileSync(path string, data []byte) error {
	f, err := os.Create(path)
	if err != nil {
		return errors.Wrapf(err, "synth: create %s", path)
	}
	if _, err := f.Write(data); err != nil {
		f.Close()
		return errors.Wrapf(err, "synth: write %s", path)
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return errors.Wrapf(err, "synth: sync %s", path)
	}
	return errors.Wrapf(f.Close(), "synth: close %s", path)
}

type generator struct {
	seed     int64
	progress func(done, total int64)
	done     int64
	total    int64
	scales   []float32 // block scales of the FP8 weight just written
}

func (g *generator) advance(n int64) {
	g.done += n
	if g.progress != nil {
		g.progress(g.done, g.total)
	}
}

func (g *generator) writeShard(w *safetensors.Writer, items []item) error {
	for _, it := range items {
		if it.scale {
			buf := make([]byte, 4*len(g.scales))
			numeric.EncodeF32(buf, g.scales)
			if err := w.WriteTensor(it.info.Name, buf); err != nil {
				return err
			}
			g.advance(int64(len(buf)))
			continue
		}
		if err := g.writeTensor(w, it); err != nil {
			return err
		}
	}
	return nil
}

// band is a run of up to 128 rows (one FP8 block row), generated independently so the work
// parallelises while the bytes stay the same.
type band struct {
	vals  []float32
	out   []byte
	scale []float32
}

func (g *generator) writeTensor(w *safetensors.Writer, it item) error {
	shape := it.spec.Shape
	rows, cols := 1, shape[0]
	if len(shape) == 2 {
		rows, cols = shape[0], shape[1]
	}
	const bandRows = numeric.FP8BlockSize
	nb := (rows + bandRows - 1) / bandRows
	_, bc := numeric.BlockGrid(rows, cols)
	fp8 := it.info.DType == safetensors.F8E4M3
	if fp8 {
		g.scales = g.scales[:0]
	}
	workers := runtime.GOMAXPROCS(0)
	bands := make([]band, workers)
	for b0 := 0; b0 < nb; b0 += workers {
		b1 := min(b0+workers, nb)
		var wg sync.WaitGroup
		errs := make([]error, b1-b0)
		for bi := b0; bi < b1; bi++ {
			wg.Add(1)
			go func(bi int) {
				defer wg.Done()
				bd := &bands[bi-b0]
				r0, r1 := bi*bandRows, min((bi+1)*bandRows, rows)
				n := (r1 - r0) * cols
				r := newRNG(g.seed, it.init.key, bi)
				switch it.info.DType {
				case safetensors.F8E4M3:
					bd.out = growB(bd.out, n)
					bd.scale = grow(bd.scale, bc)
					fillFP8(bd.out, bd.scale, r, it.init)
				case safetensors.BF16:
					bd.vals = grow(bd.vals, n)
					fill(bd.vals, r, it.init)
					bd.out = growB(bd.out, 2*n)
					numeric.EncodeBF16(bd.out, bd.vals)
				case safetensors.F32:
					bd.vals = grow(bd.vals, n)
					fill(bd.vals, r, it.init)
					bd.out = growB(bd.out, 4*n)
					numeric.EncodeF32(bd.out, bd.vals)
				default:
					errs[bi-b0] = errors.Newf("synth: no generator for dtype %s", it.info.DType)
				}
			}(bi)
		}
		wg.Wait()
		for bi := b0; bi < b1; bi++ {
			if err := errs[bi-b0]; err != nil {
				return errors.Wrapf(err, "tensor %q", it.info.Name)
			}
			bd := &bands[bi-b0]
			if err := w.WriteTensorPart(it.info.Name, bd.out); err != nil {
				return err
			}
			if fp8 {
				g.scales = append(g.scales, bd.scale...)
			}
			g.advance(int64(len(bd.out)))
		}
	}
	return nil
}

func grow(s []float32, n int) []float32 {
	if cap(s) < n {
		return make([]float32, n)
	}
	return s[:n]
}

func growB(s []byte, n int) []byte {
	if cap(s) < n {
		return make([]byte, n)
	}
	return s[:n]
}

// unitTable holds 65536 approximately standard-normal float32 values (Irwin-Hall sums of four
// 16-bit uniforms, exact integer arithmetic and one float32 multiply, so the bits are the same on
// every platform). Generators draw four table entries per 64-bit random number.
var unitTable, unitAmax = func() (*[1 << 16]float32, float32) {
	var t [1 << 16]float32
	// The centred sum of four uniform 16-bit values has standard deviation 65536/sqrt(3).
	mul := float32(math.Sqrt(3) / 65536)
	var amax float32
	for i := range t {
		x := splitmix(uint64(i) + 0x5eed)
		s := int32(x&0xffff) + int32(x>>16&0xffff) + int32(x>>32&0xffff) + int32(x>>48)
		t[i] = float32(s-131070) * mul
		amax = max(amax, t[i], -t[i])
	}
	return &t, amax
}()

// fp8Table is unitTable scaled so its largest magnitude maps to e4m3's 448, as e4m3 codes.
var fp8Table = func() *[1 << 16]byte {
	var t [1 << 16]byte
	k := 448 / unitAmax
	for i, v := range unitTable {
		t[i] = numeric.Float32ToFP8E4M3(float32(v * k))
	}
	return &t
}()

// fill writes center + std*N(0,1)-like values.
func fill(dst []float32, r *rng, k initKind) {
	for i := 0; i < len(dst); i += 4 {
		x := r.next()
		for j := 0; j < 4 && i+j < len(dst); j++ {
			v := unitTable[uint16(x>>(16*j))] * k.std
			dst[i+j] = k.center + float32(v) // the conversion forbids fusing into an FMA
		}
	}
}

// fillFP8 writes e4m3 codes of a rows x cols band (one 128-row block row) and its per-block scales:
// codes from fp8Table, each block's scale std*unitAmax/448 times a random factor in [0.75, 1.25),
// so blocks differ and a wrong scale index shows up in the output.
func fillFP8(codes []byte, scales []float32, r *rng, k initKind) {
	base := k.std * (unitAmax / 448)
	for b := range scales {
		f := 0.75 + float32(float32(r.next()>>40)*(0.5/(1<<24))) // exact: a power-of-two multiply
		scales[b] = float32(base * f)
	}
	for i := 0; i < len(codes); i += 4 {
		x := r.next()
		for j := 0; j < 4 && i+j < len(codes); j++ {
			codes[i+j] = fp8Table[uint16(x>>(16*j))]
		}
	}
}

// rng is wyrand: tiny, fast and fully specified, so streams never change with Go versions.
type rng struct{ s uint64 }

func newRNG(seed int64, key string, bandIdx int) *rng {
	h := uint64(14695981039346656037) // FNV-1a of the stream name
	for i := 0; i < len(key); i++ {
		h ^= uint64(key[i])
		h *= 1099511628211
	}
	var b [8]byte
	binary.LittleEndian.PutUint64(b[:], uint64(seed))
	for _, c := range b {
		h ^= uint64(c)
		h *= 1099511628211
	}
	h ^= splitmix(uint64(bandIdx) + 0x9e3779b97f4a7c15)
	return &rng{s: splitmix(h)}
}

func splitmix(z uint64) uint64 {
	z += 0x9e3779b97f4a7c15
	z = (z ^ z>>30) * 0xbf58476d1ce4e5b9
	z = (z ^ z>>27) * 0x94d049bb133111eb
	return z ^ z>>31
}

func (r *rng) next() uint64 {
	r.s += 0xa0761d6478bd642f
	hi, lo := bits.Mul64(r.s, r.s^0xe7037ed1a0b428db)
	return hi ^ lo
}
