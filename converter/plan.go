package converter

import (
	"os"
	"slices"

	"github.com/cockroachdb/errors"

	"github.com/tilert-go/tilert/model"
	"github.com/tilert-go/tilert/numeric"
	"github.com/tilert-go/tilert/safetensors"
	"github.com/tilert-go/tilert/weights"
)

// srcRef locates one HF tensor's bytes: absolute offset in its shard.
type srcRef struct {
	name  string
	path  string
	off   int64
	bytes int64
	dtype safetensors.DType
}

// convKind is what happens to source bytes on their way out.
type convKind int

const (
	convCopy      convKind = iota
	convBF16toF32          // bf16 block scales widened to float32 (exact)
)

// segment is a run of an output tensor's bytes: a byte range of a source tensor, or generated
// bytes (small: row scales).
type segment struct {
	src  *srcRef
	off  int64 // byte range in the source tensor
	n    int64
	conv convKind
	gen  func(dst []byte) // when src == nil; fills outN bytes
	outN int64
}

// outTensor is a stored tensor with how to produce it.
type outTensor struct {
	weights.Entry
	segs []segment
}

// source is the HF checkpoint being converted. Only headers are looked at while planning: tensor
// data is never touched through the checkpoint's memory mapping (its pages would count against
// this process's RSS), only read with pread while streaming.
type source struct {
	ck     *safetensors.Checkpoint
	cfg    *model.Config
	shapes map[string][]int // model.ExpectedShapes
}

func newSource(ck *safetensors.Checkpoint, cfg *model.Config) *source {
	return &source{ck: ck, cfg: cfg, shapes: model.ExpectedShapes(cfg)}
}

// ref looks up and checks one weight (not a scale) the way model.HFWeights does: present, the
// shape the config implies, a supported dtype, and e4m3 only for matrices with a scale tensor.
func (s *source) ref(name string) (*srcRef, error) {
	info, f, ok := s.ck.Lookup(name)
	if !ok {
		return nil, errors.WithHint(errors.Newf("%s: tensor %q is missing from the checkpoint", s.ck.Dir(), name),
			"the checkpoint is incomplete or its shards/index do not match config.json; re-download the missing shard")
	}
	want := s.shapes[name]
	if got := shapeOf(info); !slices.Equal(got, want) {
		return nil, errors.WithHint(errors.Newf("%s: tensor %q has shape %v, want %v for this config", f.Path(), name, got, want),
			"config.json does not match the weights; use the config.json that came with the checkpoint")
	}
	switch info.DType {
	case safetensors.BF16, safetensors.F16, safetensors.F32:
	case safetensors.F8E4M3:
		if len(want) != 2 {
			return nil, errors.Newf("%s: tensor %q is F8_E4M3 but is not a matrix (shape %v); only linear weights may be FP8", f.Path(), name, want)
		}
		if s.cfg.Quant == nil {
			return nil, errors.WithHint(errors.Newf("%s: tensor %q is F8_E4M3 but config.json has no quantization_config", f.Path(), name),
				"use the config.json that came with the checkpoint")
		}
	default:
		return nil, errors.WithHint(errors.Newf("%s: tensor %q has dtype %s, want F8_E4M3, BF16, F16 or F32", f.Path(), name, info.DType),
			"the checkpoint is not a DeepSeek-V3.2/GLM-5 HF checkpoint, or it was quantised in a way TileRT does not read")
	}
	return &srcRef{name: name, path: f.Path(), off: f.DataOffset() + info.Begin, bytes: info.End - info.Begin, dtype: info.DType}, nil
}

// scaleRef looks up and checks the weight_scale_inv of e4m3 weight name.
func (s *source) scaleRef(weight string) (*srcRef, error) {
	sn := model.ScaleName(weight)
	info, f, ok := s.ck.Lookup(sn)
	if !ok {
		return nil, errors.WithHint(errors.Newf("%s: FP8 tensor %q has no block scale tensor %q", s.ck.Dir(), weight, sn),
			"FP8 checkpoints store a float32 weight_scale_inv beside every e4m3 weight; the checkpoint is incomplete")
	}
	if got, want := shapeOf(info), model.ScaleShape(s.shapes[weight]); !slices.Equal(got, want) {
		return nil, errors.WithHint(errors.Newf("%s: scale tensor %q has shape %v, want %v (128x128 blocks of %v)", f.Path(), sn, got, want, s.shapes[weight]),
			"TileRT reads weight_block_size [128, 128] FP8 checkpoints")
	}
	if info.DType != safetensors.F32 && info.DType != safetensors.BF16 {
		return nil, errors.Newf("%s: scale tensor %q has dtype %s, want F32 or BF16", f.Path(), sn, info.DType)
	}
	return &srcRef{name: sn, path: f.Path(), off: f.DataOffset() + info.Begin, bytes: info.End - info.Begin, dtype: info.DType}, nil
}

// readScales reads a (small) scale tensor with pread and decodes it to float32.
func readScales(r *srcRef) ([]float32, error) {
	f, err := os.Open(r.path)
	if err != nil {
		return nil, errors.Wrapf(err, "open %s (tensor %q)", r.path, r.name)
	}
	defer f.Close()
	buf := make([]byte, r.bytes)
	if _, err := f.ReadAt(buf, r.off); err != nil {
		return nil, errors.Wrapf(err, "read %s: tensor %q", r.path, r.name)
	}
	vals := make([]float32, r.bytes/int64(r.dtype.Size()))
	if r.dtype == safetensors.BF16 {
		numeric.DecodeBF16(vals, buf)
	} else {
		numeric.DecodeF32(vals, buf)
	}
	return vals, nil
}

func shapeOf(info safetensors.TensorInfo) []int {
	s := make([]int, len(info.Shape))
	for i, d := range info.Shape {
		s[i] = int(d)
	}
	return s
}

// scaleSegs returns the segments that write a source weight's block scales as float32.
func (s *source) scaleSegs(weight string) ([]segment, error) {
	r, err := s.scaleRef(weight)
	if err != nil {
		return nil, err
	}
	if r.dtype == safetensors.BF16 {
		return []segment{{src: r, n: r.bytes, conv: convBF16toF32, outN: 2 * r.bytes}}, nil
	}
	return []segment{{src: r, n: r.bytes, outN: r.bytes}}, nil
}

// plan builds every output tensor (weights followed by their scale tensors) from the checkpoint.
// Every source tensor is checked (presence, shape, dtype, scales) before anything is written.
func (s *source) plan(devices int, mtp bool) ([]outTensor, error) {
	logs, err := weights.Plan(s.cfg, devices, mtp)
	if err != nil {
		return nil, err
	}
	var out []outTensor
	for i := range logs {
		g := &logs[i]
		ts, err := s.planOne(g)
		if err != nil {
			return nil, err
		}
		out = append(out, ts...)
	}
	return out, nil
}

func (s *source) planOne(g *weights.Logical) ([]outTensor, error) {
	refs := make([]*srcRef, len(g.HF))
	for i, n := range g.HF {
		r, err := s.ref(n)
		if err != nil {
			return nil, err
		}
		if i > 0 && r.dtype != refs[0].dtype {
			return nil, errors.WithHint(errors.Newf("%s: tensor %q is %s but %q is %s; experts of one layer must share a dtype",
				r.path, n, r.dtype, refs[0].name, refs[0].dtype), "the checkpoint mixes quantised and unquantised experts, which TileRT does not support")
		}
		refs[i] = r
	}
	dt := refs[0].dtype
	w := outTensor{Entry: weights.Entry{Name: g.Name, Kind: g.Kind, Shape: g.Shape, DType: string(dt), Device: g.Device}}
	fp8 := dt == safetensors.F8E4M3
	if fp8 && g.Kind == weights.KindPlain {
		w.Kind = weights.KindFP8Block
	}
	var sc *outTensor
	if fp8 {
		w.Scale = weights.ScaleNameOf(g.Name)
		sc = &outTensor{Entry: weights.Entry{Name: w.Scale, Kind: g.ScaleKind(), Shape: g.ScaleShape(), DType: string(safetensors.F32), Device: g.Device}}
	}
	switch g.Kind {
	case weights.KindPlain:
		w.segs = []segment{{src: refs[0], n: refs[0].bytes, outN: refs[0].bytes}}
		if fp8 {
			segs, err := s.scaleSegs(g.HF[0])
			if err != nil {
				return nil, err
			}
			sc.segs = segs
		}
	case weights.KindExperts:
		for _, r := range refs {
			w.segs = append(w.segs, segment{src: r, n: r.bytes, outN: r.bytes})
			if fp8 {
				segs, err := s.scaleSegs(r.name)
				if err != nil {
					return nil, err
				}
				sc.segs = append(sc.segs, segs...)
			}
		}
	case weights.KindAbsorbed:
		if err := s.planAbsorbed(g, refs[0], &w, sc); err != nil {
			return nil, err
		}
	}
	w.Bytes = sumOut(w.segs)
	out := []outTensor{w}
	if sc != nil {
		sc.Bytes = sumOut(sc.segs)
		out = append(out, *sc)
	}
	for _, t := range out {
		want := int64(safetensors.DType(t.DType).Size())
		for _, d := range t.Shape {
			want *= d
		}
		if t.Bytes != want {
			return nil, errors.AssertionFailedf("%s: planned %d bytes, shape %v of %s needs %d", t.Name, t.Bytes, t.Shape, t.DType, want)
		}
	}
	return out, nil
}

// planAbsorbed slices kv_b_proj ([heads*(nope+v), kv_lora], rows of head h: nope K rows then v V
// rows) into per-head W_UK (half 0) or W_UV (half 1) rows, and for e4m3 gives each stored row its
// own copy of its block's scales so a head needs no 128-row alignment.
func (s *source) planAbsorbed(g *weights.Logical, kvb *srcRef, w, sc *outTensor) error {
	cfg := s.cfg
	nope, v, kvl := int64(cfg.QKNopeHeadDim), int64(cfg.VHeadDim), int64(cfg.KVLoraRank)
	stride := nope + v
	first, rows := int64(0), nope
	if g.Half == 1 {
		first, rows = nope, v
	}
	es := int64(safetensors.DType(kvb.dtype).Size())
	rowBytes := kvl * es
	for h := range int64(cfg.NumHeads) {
		r0 := h*stride + first
		w.segs = append(w.segs, segment{src: kvb, off: r0 * rowBytes, n: rows * rowBytes, outN: rows * rowBytes})
	}
	if sc == nil {
		return nil
	}
	sr, err := s.scaleRef(kvb.name)
	if err != nil {
		return err
	}
	grid, err := readScales(sr) // kv_b_proj's (small) block scale grid, read once
	if err != nil {
		return err
	}
	bc := (kvl + numeric.FP8BlockSize - 1) / numeric.FP8BlockSize
	for h := range int64(cfg.NumHeads) {
		r0 := h*stride + first
		sc.segs = append(sc.segs, segment{outN: rows * bc * 4, gen: func(dst []byte) {
			vals := make([]float32, 0, rows*bc)
			for r := r0; r < r0+rows; r++ {
				blk := r / numeric.FP8BlockSize
				vals = append(vals, grid[blk*bc:(blk+1)*bc]...)
			}
			numeric.EncodeF32(dst, vals)
		}})
	}
	return nil
}

func sumOut(segs []segment) int64 {
	var n int64
	for _, s := range segs {
		n += s.outN
	}
	return n
}
