package weights

import (
	"hash/crc32"
	"path/filepath"
	"sync"

	"github.com/cockroachdb/errors"

	"github.com/tilert-go/tilert/model"
	"github.com/tilert-go/tilert/numeric"
	"github.com/tilert-go/tilert/safetensors"
)

// Dir is an open converted directory: shards memory-mapped, every tensor's checksum checked the
// first time its bytes are handed out.
type Dir struct {
	dir     string
	m       *Manifest
	cfg     *model.Config
	files   map[string]*safetensors.File
	entries map[string]*Entry

	mu       sync.Mutex
	verified map[string]bool
}

// Open checks dir's structure (as VerifyWith without checksums) and maps its shards. Checksums
// are checked lazily, per tensor, by Raw and Get.
func Open(dir string) (*Dir, error) {
	m, cfg, err := check(dir, VerifyOptions{})
	if err != nil {
		return nil, err
	}
	d := &Dir{dir: dir, m: m, cfg: cfg, files: map[string]*safetensors.File{}, entries: map[string]*Entry{}, verified: map[string]bool{}}
	for i := range m.Tensors {
		d.entries[m.Tensors[i].Name] = &m.Tensors[i]
	}
	for _, s := range m.Shards {
		f, err := safetensors.Open(filepath.Join(dir, s.File))
		if err != nil {
			d.Close()
			return nil, err
		}
		d.files[s.File] = f
	}
	return d, nil
}

// OpenWeights opens a converted directory as model.Weights: Get returns, by HF tensor name, the
// same float32 tensor model.OpenWeights returns from the source checkpoint (bit for bit). The
// config's NumNextNLayers is 0 when the MTP layers were not converted.
func OpenWeights(dir string) (model.Weights, *model.Config, error) {
	d, err := Open(dir)
	if err != nil {
		return nil, nil, err
	}
	return d, d.cfg, nil
}

// Close unmaps the shards; tensors returned by Get stay valid, slices from Raw do not.
func (d *Dir) Close() error {
	var errs error
	for _, f := range d.files {
		errs = errors.CombineErrors(errs, f.Close())
	}
	d.files = nil
	return errs
}

// Manifest is the directory's manifest (do not modify).
func (d *Dir) Manifest() *Manifest { return d.m }

// Config is the model config (NumNextNLayers 0 when the MTP layers were not converted).
func (d *Dir) Config() *model.Config { return d.cfg }

// Entry looks up a stored tensor by its stored name.
func (d *Dir) Entry(name string) (*Entry, bool) {
	e, ok := d.entries[name]
	return e, ok
}

// Raw returns a stored tensor's bytes (a read-only view of the mapping, valid until Close),
// after checking its checksum once.
func (d *Dir) Raw(name string) ([]byte, *Entry, error) {
	e, ok := d.entries[name]
	if !ok {
		return nil, nil, errors.Newf("%s: no stored tensor %q", d.dir, name)
	}
	f := d.files[e.Shard]
	if f == nil {
		return nil, nil, errors.Newf("%s: tensor %q read after Close", d.dir, name)
	}
	data, err := f.Data(name)
	if err != nil {
		return nil, nil, err
	}
	d.mu.Lock()
	done := d.verified[name]
	d.mu.Unlock()
	if !done {
		if got := CRCHex(crc32.Checksum(data, Castagnoli)); got != e.CRC32C {
			return nil, nil, errors.WithHint(errors.Newf("%s: tensor %q has checksum %s, the manifest says %s (the data is corrupt)",
				f.Path(), name, got, e.CRC32C), hintReconvert)
		}
		d.mu.Lock()
		d.verified[name] = true
		d.mu.Unlock()
	}
	return data, e, nil
}

func (d *Dir) scales(e *Entry) ([]float32, error) {
	if e.Scale == "" {
		return nil, nil
	}
	data, _, err := d.Raw(e.Scale)
	if err != nil {
		return nil, err
	}
	s := make([]float32, len(data)/4)
	numeric.DecodeF32(s, data)
	return s, nil
}

// Get returns a tensor as float32 by HF name (kv_b_proj is rebuilt from W_UK and W_UV, a routed
// expert is cut from its device stack) or by stored name (fp8 dequantised with its scales).
func (d *Dir) Get(name string) (*model.Tensor, error) {
	if e, ok := d.entries[name]; ok {
		return d.getStored(name, e)
	}
	if l, ok := IsKVBProj(name); ok && d.hasLayer(l) {
		return d.getKVB(name, l)
	}
	if l, ex, proj, ok := ParseExpertName(name); ok && d.hasLayer(l) && d.cfg.IsMoELayer(l) && ex < d.cfg.NRoutedExperts {
		return d.getExpert(name, l, ex, proj)
	}
	if name == model.LMHeadName && d.cfg.TieWordEmbeddings {
		t, err := d.Get(model.EmbedTokensName)
		if err != nil {
			return nil, err
		}
		t.Name = name
		return t, nil
	}
	if l, ok := LayerOf(name); ok && l >= d.cfg.NumLayers && d.m.MTPLayers == 0 {
		return nil, errors.WithHint(errors.Newf("%s: tensor %q belongs to the MTP layer, which was not converted", d.dir, name),
			"convert with --append-mtp to use MTP")
	}
	return nil, errors.WithHint(errors.Newf("%s: tensor %q is not a weight of this converted %s model", d.dir, name, d.cfg.Family),
		"names are the HF checkpoint's (see model.Specs) or the stored names in the manifest")
}

func (d *Dir) hasLayer(l int) bool { return l >= 0 && l < d.cfg.NumAllLayers() }

func (d *Dir) getStored(name string, e *Entry) (*model.Tensor, error) {
	data, _, err := d.Raw(name)
	if err != nil {
		return nil, err
	}
	t := &model.Tensor{Name: name, Shape: ints(e.Shape), Data: make([]float32, numel(e.Shape))}
	switch safetensors.DType(e.DType) {
	case safetensors.BF16:
		numeric.DecodeBF16(t.Data, data)
	case safetensors.F16:
		numeric.DecodeF16(t.Data, data)
	case safetensors.F32:
		numeric.DecodeF32(t.Data, data)
	case safetensors.F8E4M3:
		s, err := d.scales(e)
		if err != nil {
			return nil, err
		}
		if err := dequantStored(t.Data, data, s, e); err != nil {
			return nil, errors.Wrapf(err, "%s: tensor %q", d.dir, name)
		}
	default:
		return nil, errors.Newf("%s: tensor %q has dtype %s", d.dir, name, e.DType)
	}
	return t, nil
}

// dequantStored dequantises a whole stored e4m3 tensor of any fp8 kind.
func dequantStored(dst []float32, w []byte, s []float32, e *Entry) error {
	switch e.Kind {
	case KindFP8Block:
		return numeric.DequantBlockFP8(dst, w, s, int(e.Shape[0]), int(e.Shape[1]))
	case KindExperts:
		n, r, c := int(e.Shape[0]), int(e.Shape[1]), int(e.Shape[2])
		per, sper := r*c, len(s)/n
		for k := range n {
			if err := numeric.DequantBlockFP8(dst[k*per:(k+1)*per], w[k*per:(k+1)*per], s[k*sper:(k+1)*sper], r, c); err != nil {
				return err
			}
		}
		return nil
	case KindAbsorbed:
		dequantRows(dst, w, s, int(e.Shape[2]))
		return nil
	}
	return errors.Newf("kind %s is not an fp8 weight", e.Kind)
}

// dequantRows applies per-row block scales: dst[r*cols+c] = fp8(w[r*cols+c]) * s[r*bc + c/128].
func dequantRows(dst []float32, w []byte, s []float32, cols int) {
	bc := (cols + numeric.FP8BlockSize - 1) / numeric.FP8BlockSize
	for r := range len(w) / cols {
		for c := range cols {
			dst[r*cols+c] = numeric.FP8E4M3ToFloat32(w[r*cols+c]) * s[r*bc+c/numeric.FP8BlockSize]
		}
	}
}

// getKVB rebuilds kv_b_proj [heads*(nope+v), kv_lora]: head h's nope rows from W_UK then its v
// rows from W_UV.
func (d *Dir) getKVB(name string, l int) (*model.Tensor, error) {
	ukName, uvName := AbsorbedNames(l)
	uk, err := d.getStored(ukName, d.entries[ukName])
	if err != nil {
		return nil, err
	}
	uv, err := d.getStored(uvName, d.entries[uvName])
	if err != nil {
		return nil, err
	}
	c := d.cfg
	nope, v, kvl := c.QKNopeHeadDim*c.KVLoraRank, c.VHeadDim*c.KVLoraRank, c.KVLoraRank
	t := &model.Tensor{Name: name, Shape: []int{c.NumHeads * (c.QKNopeHeadDim + c.VHeadDim), kvl}, Data: make([]float32, 0, c.NumHeads*(nope+v))}
	for h := range c.NumHeads {
		t.Data = append(t.Data, uk.Data[h*nope:(h+1)*nope]...)
		t.Data = append(t.Data, uv.Data[h*v:(h+1)*v]...)
	}
	return t, nil
}

func (d *Dir) getExpert(name string, l, ex int, proj string) (*model.Tensor, error) {
	dev, local := DeviceOfExpert(ex, d.m.Devices, d.cfg.NRoutedExperts)
	sn := ExpertStackName(l, dev, proj)
	e, ok := d.entries[sn]
	if !ok {
		return nil, errors.Newf("%s: expert stack %q for %q is missing", d.dir, sn, name)
	}
	data, _, err := d.Raw(sn)
	if err != nil {
		return nil, err
	}
	r, c := int(e.Shape[1]), int(e.Shape[2])
	es := safetensors.DType(e.DType).Size()
	one := data[local*r*c*es : (local+1)*r*c*es]
	t := &model.Tensor{Name: name, Shape: []int{r, c}, Data: make([]float32, r*c)}
	switch safetensors.DType(e.DType) {
	case safetensors.BF16:
		numeric.DecodeBF16(t.Data, one)
	case safetensors.F16:
		numeric.DecodeF16(t.Data, one)
	case safetensors.F32:
		numeric.DecodeF32(t.Data, one)
	case safetensors.F8E4M3:
		sdata, _, err := d.Raw(e.Scale)
		if err != nil {
			return nil, err
		}
		sper := len(sdata) / int(e.Shape[0]) // bytes of one expert's scale grid
		s := make([]float32, sper/4)
		numeric.DecodeF32(s, sdata[local*sper:(local+1)*sper])
		if err := numeric.DequantBlockFP8(t.Data, one, s, r, c); err != nil {
			return nil, errors.Wrapf(err, "%s: tensor %q", d.dir, name)
		}
	default:
		return nil, errors.Newf("%s: tensor %q has dtype %s", d.dir, sn, e.DType)
	}
	return t, nil
}

func ints(s []int64) []int {
	o := make([]int, len(s))
	for i, v := range s {
		o[i] = int(v)
	}
	return o
}

func numel(s []int64) int {
	n := 1
	for _, v := range s {
		n *= int(v)
	}
	return n
}
