package model

import (
	"fmt"
	"log/slog"
	"path/filepath"
	"slices"

	"github.com/cockroachdb/errors"

	"github.com/tilert-go/tilert/numeric"
	"github.com/tilert-go/tilert/safetensors"
)

// Tensor is a float32 weight with its shape (row-major).
type Tensor struct {
	Name  string
	Shape []int
	Data  []float32
}

// Weights gives float32 access to a model's weights by HF tensor name.
type Weights interface {
	Get(name string) (*Tensor, error)
}

// HFWeights reads an HF checkpoint directory: FP8 e4m3 weights are dequantised with their
// weight_scale_inv block scales, bf16/f16/f32 decoded. Safe for concurrent use.
type HFWeights struct {
	cfg   *Config
	ckpt  *safetensors.Checkpoint
	specs map[string]TensorSpec
	dir   string
}

// OpenWeights opens an HF checkpoint directory (config.json + safetensors shards) and checks that
// every tensor the config implies is present with the right shape and dtype.
func OpenWeights(dir string) (Weights, error) {
	w, err := OpenHF(dir)
	if err != nil {
		return nil, err
	}
	return w, nil
}

// OpenHF is OpenWeights returning the concrete type (Config, Close, Raw, Check).
func OpenHF(dir string) (*HFWeights, error) {
	cfg, err := LoadConfig(dir)
	if err != nil {
		return nil, err
	}
	ck, err := safetensors.OpenDir(dir)
	if err != nil {
		return nil, errors.Wrapf(err, "open checkpoint %s", dir)
	}
	w := &HFWeights{cfg: cfg, ckpt: ck, dir: dir, specs: map[string]TensorSpec{}}
	for _, s := range Specs(cfg) {
		w.specs[s.Name] = s
	}
	if err := w.Check(); err != nil {
		ck.Close()
		return nil, err
	}
	return w, nil
}

// Config is the checkpoint's validated config.
func (w *HFWeights) Config() *Config { return w.cfg }

// Checkpoint exposes the underlying safetensors checkpoint (zero-copy reads for converters).
func (w *HFWeights) Checkpoint() *safetensors.Checkpoint { return w.ckpt }

// Close unmaps the shards; tensors returned by Get stay valid (they are copies).
func (w *HFWeights) Close() error { return w.ckpt.Close() }

// Spec returns the expected shape and storage of a logical weight.
func (w *HFWeights) Spec(name string) (TensorSpec, bool) {
	s, ok := w.specs[name]
	return s, ok
}

func (w *HFWeights) where(f *safetensors.File) string {
	if f == nil {
		return w.dir
	}
	return f.Path()
}

func shapeOf(info safetensors.TensorInfo) []int {
	s := make([]int, len(info.Shape))
	for i, d := range info.Shape {
		s[i] = int(d)
	}
	return s
}

// Raw is one stored weight as found in the checkpoint: its data bytes (a view into the mmap) and,
// for FP8 weights, its block scales.
type Raw struct {
	Info      safetensors.TensorInfo
	File      string
	Data      []byte
	Scale     []float32 // nil unless Info.DType is F8_E4M3
	ScaleInfo safetensors.TensorInfo
}

// Raw looks up and checks a logical weight without converting it.
func (w *HFWeights) Raw(name string) (*Raw, error) {
	spec, known := w.specs[name]
	if !known && name == LMHeadName && w.cfg.TieWordEmbeddings {
		return w.Raw(EmbedTokensName)
	}
	if !known {
		return nil, errors.WithHint(errors.Newf("%s: tensor %q is not a weight of a %s model with this config", w.dir, name, w.cfg.Family),
			"tensor names follow the HF checkpoint layout (see model.Specs)")
	}
	info, f, ok := w.ckpt.Lookup(name)
	if !ok {
		return nil, errors.WithHint(errors.Newf("%s: tensor %q is missing from the checkpoint", w.dir, name),
			"the checkpoint is incomplete or its shards/index do not match config.json; re-download the missing shard")
	}
	file := w.where(f)
	if got := shapeOf(info); !slices.Equal(got, spec.Shape) {
		return nil, errors.WithHint(errors.Newf("%s: tensor %q has shape %v, want %v for this config", file, name, got, spec.Shape),
			"config.json does not match the weights; use the config.json that came with the checkpoint")
	}
	r := &Raw{Info: info, File: file}
	switch info.DType {
	case safetensors.BF16, safetensors.F16, safetensors.F32:
	case safetensors.F8E4M3:
		if len(spec.Shape) != 2 {
			return nil, errors.Newf("%s: tensor %q is F8_E4M3 but is not a matrix (shape %v); only linear weights may be FP8", file, name, spec.Shape)
		}
		sn := ScaleName(name)
		sinfo, sf, ok := w.ckpt.Lookup(sn)
		if !ok {
			return nil, errors.WithHint(errors.Newf("%s: FP8 tensor %q has no block scale tensor %q", file, name, sn),
				"FP8 checkpoints store a float32 weight_scale_inv beside every e4m3 weight; the checkpoint is incomplete")
		}
		sfile := w.where(sf)
		if got, want := shapeOf(sinfo), ScaleShape(spec.Shape); !slices.Equal(got, want) {
			return nil, errors.WithHint(errors.Newf("%s: scale tensor %q has shape %v, want %v (128x128 blocks of %v)", sfile, sn, got, want, spec.Shape),
				"TileRT reads weight_block_size [128, 128] FP8 checkpoints")
		}
		if sinfo.DType != safetensors.F32 && sinfo.DType != safetensors.BF16 {
			return nil, errors.Newf("%s: scale tensor %q has dtype %s, want F32", sfile, sn, sinfo.DType)
		}
		sdata, err := w.ckpt.Data(sn)
		if err != nil {
			return nil, errors.Wrapf(err, "%s: read %q", sfile, sn)
		}
		r.ScaleInfo = sinfo
		r.Scale = make([]float32, len(sdata)/sinfo.DType.Size())
		if sinfo.DType == safetensors.F32 {
			numeric.DecodeF32(r.Scale, sdata)
		} else {
			numeric.DecodeBF16(r.Scale, sdata)
		}
	default:
		return nil, errors.WithHint(errors.Newf("%s: tensor %q has dtype %s, want F8_E4M3, BF16, F16 or F32", file, name, info.DType),
			"the checkpoint is not a DeepSeek-V3.2/GLM-5 HF checkpoint, or it was converted with an unsupported quantisation")
	}
	data, err := w.ckpt.Data(name)
	if err != nil {
		return nil, errors.Wrapf(err, "%s: read %q", file, name)
	}
	if want := info.NumElements() * int64(info.DType.Size()); int64(len(data)) != want {
		return nil, errors.Newf("%s: tensor %q holds %d bytes, want %d", file, name, len(data), want)
	}
	r.Data = data
	return r, nil
}

// Get returns a logical weight as float32 (FP8 dequantised with DeepSeek's block formula).
func (w *HFWeights) Get(name string) (*Tensor, error) {
	r, err := w.Raw(name)
	if err != nil {
		return nil, err
	}
	shape := shapeOf(r.Info)
	n := int(r.Info.NumElements())
	t := &Tensor{Name: name, Shape: shape, Data: make([]float32, n)}
	switch r.Info.DType {
	case safetensors.BF16:
		numeric.DecodeBF16(t.Data, r.Data)
	case safetensors.F16:
		numeric.DecodeF16(t.Data, r.Data)
	case safetensors.F32:
		numeric.DecodeF32(t.Data, r.Data)
	case safetensors.F8E4M3:
		if err := numeric.DequantBlockFP8(t.Data, r.Data, r.Scale, shape[0], shape[1]); err != nil {
			return nil, errors.Wrapf(err, "%s: dequantise %q", r.File, name)
		}
	}
	return t, nil
}

// Check verifies, without decoding, that every weight the config implies is present with the
// right shape and dtype (and FP8 weights have their scales). Extra tensors are logged, not errors.
func (w *HFWeights) Check() error {
	used := make(map[string]bool, len(w.specs)*2)
	for _, s := range Specs(w.cfg) {
		r, err := w.Raw(s.Name)
		if err != nil {
			return err
		}
		used[s.Name] = true
		if r.Scale != nil {
			used[ScaleName(s.Name)] = true
		}
	}
	var extra []string
	for _, n := range w.ckpt.Names() {
		if !used[n] {
			extra = append(extra, n)
		}
	}
	if len(extra) > 0 {
		slog.Warn("checkpoint has tensors this model does not use", "dir", w.dir, "count", len(extra), "first", extra[0])
	}
	return nil
}

// String names the checkpoint for logs.
func (w *HFWeights) String() string {
	return fmt.Sprintf("%s (%s)", filepath.Clean(w.dir), w.cfg.Family)
}
