package gpu

import (
	"os"
	"path/filepath"

	"github.com/cockroachdb/errors"

	"github.com/tilert-go/tilert/model"
	"github.com/tilert-go/tilert/numeric"
	"github.com/tilert-go/tilert/safetensors"
	"github.com/tilert-go/tilert/weights"
)

// Source hands the engine its weights in stored form: FP8 linear weights as
// e4m3 bytes with their block scales (uploaded as they are, for the fp8
// GEMVs), everything else as float32. FromHF and FromConverted are the two
// implementations.
type Source interface {
	Config() *model.Config
	// Linear returns a [rows][cols] linear weight.
	Linear(name string, rows, cols int) (*Matrix, error)
	// Expert returns routed expert e's projection proj ("gate_proj",
	// "up_proj" or "down_proj") of layer.
	Expert(layer, e int, proj string, rows, cols int) (*Matrix, error)
	// Absorbed returns layer's W_UK [heads][nope][kv_lora] and W_UV
	// [heads][v][kv_lora] (docs/LAYOUTS.md, kind absorbed), FP8 with one
	// scale per row and 128 columns, or float32.
	Absorbed(layer int) (uk, uv *Matrix, err error)
	// Get returns any weight as float32 (norms, biases, embeddings).
	Get(name string) (*model.Tensor, error)
}

// matrixSharer is a Source whose tensors of one shape are one shared
// *Matrix that nobody rewrites (Dummy): the uploader copies a matrix it
// has put on the device once from there, device to device, instead of
// from the host again. A checkpoint's source may reuse a buffer for other
// bytes, so pointer identity means nothing there.
type matrixSharer interface{ sharesMatrices() bool }

// expertBanker is a Source whose MoE layers may all read one bank of
// routed experts (DummyOneBank): the uploader places the first MoE layer's
// experts and points every later MoE layer of the same shape at them.
type expertBanker interface{ oneExpertBank() bool }

// periodic is a Source whose large bf16 tensors repeat one short period
// of values (Dummy: bf16Rand's): periodicBF16 returns tensor name's period
// (bf16-exact) and its shape, ok false where it has none. The
// uploader sends the period and copies it on the device to the tensor's
// length: the bytes of the whole tensor, never built on the host (a
// vocabulary table is ~0.9 G values, which took most of bench decode's
// start to draw, check and encode).
type periodic interface {
	periodicBF16(name string) (period []float32, rows, cols int, ok bool)
}

// Matrix is a weight in stored form: FP8 (FP8 + Scale) or float32 (F32).
// Scale is [ceil(rows/128)][ceil(cols/128)] for a linear weight and
// [rows][ceil(cols/128)] for the absorbed matrices.
type Matrix struct {
	Rows, Cols int
	FP8        []byte
	Scale      []float32
	F32        []float32
}

func (m *Matrix) check(name string, rows, cols int, rowScale bool) error {
	if m.Rows != rows || m.Cols != cols {
		return errors.Newf("weight %s: shape [%d %d], want [%d %d]", name, m.Rows, m.Cols, rows, cols)
	}
	cb := (cols + 127) / 128
	srows := (rows + 127) / 128
	if rowScale {
		srows = rows
	}
	switch {
	case m.FP8 != nil:
		if len(m.FP8) != rows*cols || len(m.Scale) != srows*cb {
			return errors.Newf("weight %s: %d fp8 bytes and %d scales for [%d %d]", name, len(m.FP8), len(m.Scale), rows, cols)
		}
	case len(m.F32) != rows*cols:
		return errors.Newf("weight %s: %d values for [%d %d]", name, len(m.F32), rows, cols)
	}
	return nil
}

// Open opens dir as a converted TileRT weights directory (it has
// tilert_manifest.json) or as an HF checkpoint. close releases the mapping.
func Open(dir string) (src Source, close func() error, err error) {
	if _, err := os.Stat(filepath.Join(dir, "tilert_manifest.json")); err == nil {
		d, err := weights.Open(dir)
		if err != nil {
			return nil, nil, err
		}
		return FromConverted(d), d.Close, nil
	}
	w, err := model.OpenHF(dir)
	if err != nil {
		return nil, nil, err
	}
	return FromHF(w), w.Close, nil
}

// FromHF reads an HF checkpoint: FP8 weights and their weight_scale_inv as
// stored; W_UK/W_UV are row slices of kv_b_proj, each row carrying its
// 128-row block's scales.
func FromHF(w *model.HFWeights) Source { return hfSource{w} }

type hfSource struct{ w *model.HFWeights }

func (s hfSource) Config() *model.Config                  { return s.w.Config() }
func (s hfSource) Get(name string) (*model.Tensor, error) { return s.w.Get(name) }

func (s hfSource) Linear(name string, rows, cols int) (*Matrix, error) {
	r, err := s.w.Raw(name)
	if err != nil {
		return nil, err
	}
	m := &Matrix{Rows: rows, Cols: cols}
	if r.Info.DType == safetensors.F8E4M3 {
		m.FP8, m.Scale = r.Data, r.Scale
	} else {
		t, err := s.w.Get(name)
		if err != nil {
			return nil, err
		}
		m.F32 = t.Data
	}
	return m, m.check(name, rows, cols, false)
}

func (s hfSource) Expert(layer, e int, proj string, rows, cols int) (*Matrix, error) {
	g, u, d := model.Layer(layer).Expert(e)
	name := map[string]string{"gate_proj": g, "up_proj": u, "down_proj": d}[proj]
	if name == "" {
		return nil, errors.Newf("unknown expert projection %q", proj)
	}
	return s.Linear(name, rows, cols)
}

func (s hfSource) Absorbed(layer int) (*Matrix, *Matrix, error) {
	c := s.w.Config()
	H, nope, vd, R := c.NumHeads, c.QKNopeHeadDim, c.VHeadDim, c.KVLoraRank
	kvb, err := s.Linear(model.Layer(layer).KVBProj, H*(nope+vd), R)
	if err != nil {
		return nil, nil, err
	}
	return splitKVB(kvb, H, nope, vd, R)
}

// splitKVB cuts kv_b_proj [H*(nope+v)][R] into W_UK and W_UV with per-row
// scales (docs/LAYOUTS.md: s_uk[h, r, k] = scale[(h*(nope+v)+r)/128][k]).
func splitKVB(kvb *Matrix, H, nope, vd, R int) (*Matrix, *Matrix, error) {
	rb := (R + 127) / 128
	uk := &Matrix{Rows: H * nope, Cols: R}
	uv := &Matrix{Rows: H * vd, Cols: R}
	for h := 0; h < H; h++ {
		for r := 0; r < nope+vd; r++ {
			src := h*(nope+vd) + r
			dst, dr := uk, h*nope+r
			if r >= nope {
				dst, dr = uv, h*vd+r-nope
			}
			if kvb.FP8 != nil {
				if dst.FP8 == nil {
					dst.FP8 = make([]byte, dst.Rows*R)
					dst.Scale = make([]float32, dst.Rows*rb)
				}
				copy(dst.FP8[dr*R:(dr+1)*R], kvb.FP8[src*R:(src+1)*R])
				copy(dst.Scale[dr*rb:(dr+1)*rb], kvb.Scale[(src/128)*rb:(src/128+1)*rb])
			} else {
				if dst.F32 == nil {
					dst.F32 = make([]float32, dst.Rows*R)
				}
				copy(dst.F32[dr*R:(dr+1)*R], kvb.F32[src*R:(src+1)*R])
			}
		}
	}
	return uk, uv, nil
}

// FromConverted reads a converted TileRT weights directory (docs/LAYOUTS.md):
// fp8_block weights and absorbed matrices as stored, routed experts cut from
// their device stacks.
func FromConverted(d *weights.Dir) Source { return convSource{d} }

type convSource struct{ d *weights.Dir }

func (s convSource) Config() *model.Config                  { return s.d.Config() }
func (s convSource) Get(name string) (*model.Tensor, error) { return s.d.Get(name) }

func (s convSource) scales(e *weights.Entry) ([]float32, error) {
	data, _, err := s.d.Raw(e.Scale)
	if err != nil {
		return nil, err
	}
	out := make([]float32, len(data)/4)
	numeric.DecodeF32(out, data)
	return out, nil
}

// stored returns a stored tensor in Matrix form; FP8 ones keep their bytes.
func (s convSource) stored(name string, rows, cols int, rowScale bool) (*Matrix, error) {
	e, ok := s.d.Entry(name)
	m := &Matrix{Rows: rows, Cols: cols}
	if ok && safetensors.DType(e.DType) == safetensors.F8E4M3 {
		data, _, err := s.d.Raw(name)
		if err != nil {
			return nil, err
		}
		if m.Scale, err = s.scales(e); err != nil {
			return nil, err
		}
		m.FP8 = data
		return m, m.check(name, rows, cols, rowScale)
	}
	t, err := s.d.Get(name)
	if err != nil {
		return nil, err
	}
	m.F32 = t.Data
	return m, m.check(name, rows, cols, rowScale)
}

func (s convSource) Linear(name string, rows, cols int) (*Matrix, error) {
	return s.stored(name, rows, cols, false)
}

func (s convSource) Absorbed(layer int) (*Matrix, *Matrix, error) {
	c := s.d.Config()
	ukN, uvN := weights.AbsorbedNames(layer)
	uk, err := s.stored(ukN, c.NumHeads*c.QKNopeHeadDim, c.KVLoraRank, true)
	if err != nil {
		return nil, nil, err
	}
	uv, err := s.stored(uvN, c.NumHeads*c.VHeadDim, c.KVLoraRank, true)
	if err != nil {
		return nil, nil, err
	}
	return uk, uv, nil
}

func (s convSource) Expert(layer, ex int, proj string, rows, cols int) (*Matrix, error) {
	c := s.d.Config()
	devs := max(1, s.d.Manifest().Devices)
	dev, local := weights.DeviceOfExpert(ex, devs, c.NRoutedExperts)
	sn := weights.ExpertStackName(layer, dev, proj)
	e, ok := s.d.Entry(sn)
	if !ok {
		return nil, errors.Newf("converted weights: expert stack %q (layer %d expert %d) is missing", sn, layer, ex)
	}
	m := &Matrix{Rows: rows, Cols: cols}
	if safetensors.DType(e.DType) == safetensors.F8E4M3 {
		data, _, err := s.d.Raw(sn)
		if err != nil {
			return nil, err
		}
		if len(data) < (local+1)*rows*cols {
			return nil, errors.Newf("converted weights: stack %q holds %d bytes, expert %d of [%d %d] does not fit", sn, len(data), local, rows, cols)
		}
		sc, err := s.scales(e)
		if err != nil {
			return nil, err
		}
		per := ((rows + 127) / 128) * ((cols + 127) / 128)
		if len(sc) < (local+1)*per {
			return nil, errors.Newf("converted weights: scales of %q too short for expert %d", sn, local)
		}
		m.FP8 = data[local*rows*cols : (local+1)*rows*cols]
		m.Scale = sc[local*per : (local+1)*per]
		return m, m.check(sn, rows, cols, false)
	}
	g, u, d := model.Layer(layer).Expert(ex)
	name := map[string]string{"gate_proj": g, "up_proj": u, "down_proj": d}[proj]
	t, err := s.d.Get(name)
	if err != nil {
		return nil, err
	}
	m.F32 = t.Data
	return m, m.check(name, rows, cols, false)
}
