package gpu

import (
	"math"
	"math/rand/v2"
	"sort"
	"strings"
	"sync"

	"github.com/cockroachdb/errors"

	"github.com/tilert-go/tilert/model"
)

// Dummy is a Source of random weights with cfg's real dimensions, for
// benchmarks of models whose checkpoints do not fit a disk or one GPU's
// worth of files (tilert bench decode --dummy-weights). One random block is
// drawn per shape and storage and handed out for every tensor of that shape,
// so building it costs a few host seconds however many layers and experts
// the model has; the device still holds (and a step still reads) one copy
// per tensor. Values keep activations O(1): fp8 codes within +-1.875 with
// 128x128 block scales 1/sqrt(fan_in), bf16-exact tables, norms near 1.
// The output is meaningless; the bytes and the work per step are real.
func Dummy(cfg *model.Config, seed uint64) Source {
	d := &dummySource{cfg: cfg, seed: seed, specs: map[string]model.TensorSpec{}, blocks: map[string]*Matrix{},
		periods: map[string][]float32{}}
	for _, s := range model.Specs(cfg) {
		d.specs[s.Name] = s
	}
	return d
}

// DummyOneBank is Dummy whose MoE layers all point at one bank of routed
// experts in device memory (bench decode --one-expert-bank). A step reads
// the same bytes as on Dummy: each MoE layer streams its own routed
// experts' weights from HBM, never from the L2, since some 600 MB of other
// weights pass between two layers' experts. What it changes is the memory
// the model holds: DeepSeek-V3.2 dims take 11.3 GB of routed experts a MoE
// layer, so 9 of them (the benchmark) need an H200's 141 GB, and
// with one bank they fit an 80 GB card. A layer pair that routes to the same
// expert reads the same addresses either way, so only the translations
// (one 11 GB bank against nine) differ.
func DummyOneBank(cfg *model.Config, seed uint64) Source {
	d := Dummy(cfg, seed).(*dummySource)
	d.oneBank = true
	return d
}

type dummySource struct {
	cfg     *model.Config
	seed    uint64
	oneBank bool // DummyOneBank
	specs   map[string]model.TensorSpec
	mu      sync.Mutex
	blocks  map[string]*Matrix // by kind and shape
	// periods: the blocks' first bf16Period values where only those were
	// asked for (periodicBF16), by the blocks' keys
	periods map[string][]float32
}

func (d *dummySource) Config() *model.Config { return d.cfg }

// sharesMatrices: block hands out one *Matrix per kind and shape, never
// rewritten (matrixSharer). Uploading a real model's routed experts from
// the host took most of bench decode's ~22 s start (DeepSeek-V3.2 dims, 9
// MoE layers: ~100 GB of identical experts through pageable copies).
func (d *dummySource) sharesMatrices() bool { return true }

func (d *dummySource) oneExpertBank() bool { return d.oneBank }

func (d *dummySource) rng(key string) *rand.Rand {
	h := uint64(1469598103934665603)
	for i := 0; i < len(key); i++ {
		h = (h ^ uint64(key[i])) * 1099511628211
	}
	return rand.New(rand.NewPCG(d.seed, h))
}

// bf16Period: past it, bf16Rand repeats its first bf16Period values (a
// variable for tests).
var bf16Period = 1 << 20

// bf16Rand draws n bf16-exact values of standard deviation std around center.
// Past bf16Period values the first block repeats (a vocabulary-sized table
// would take tens of seconds to draw).
func bf16Rand(r *rand.Rand, n int, std, center float32) []float32 {
	v := make([]float32, n)
	m := min(n, bf16Period)
	for i := range m {
		f := center + std*float32(r.NormFloat64())
		v[i] = math.Float32frombits(math.Float32bits(f) &^ 0xffff)
	}
	for i := m; i < n; i += m {
		copy(v[i:], v[:m])
	}
	return v
}

func blockKey(kind string, rows, cols int, rowScale bool) string {
	key := kind + ":" + itoa(rows) + "x" + itoa(cols)
	if rowScale {
		key += ":rows"
	}
	return key
}

// block returns the shared random matrix of a kind and shape.
func (d *dummySource) block(kind string, rows, cols int, rowScale bool) *Matrix {
	key := blockKey(kind, rows, cols, rowScale)
	d.mu.Lock()
	defer d.mu.Unlock()
	if m, ok := d.blocks[key]; ok {
		return m
	}
	r := d.rng(key)
	m := &Matrix{Rows: rows, Cols: cols}
	switch kind {
	case "fp8":
		m.FP8 = make([]byte, rows*cols)
		for i := 0; i < len(m.FP8); i += 8 {
			u := r.Uint64()
			for b := 0; b < 8 && i+b < len(m.FP8); b++ {
				// codes 0x00..0x3f with either sign: |v| <= 1.875, never NaN
				m.FP8[i+b] = byte(u>>(8*b)) & 0xbf
			}
		}
		srows := (rows + 127) / 128
		if rowScale {
			srows = rows
		}
		m.Scale = make([]float32, srows*((cols+127)/128))
		s := float32(1 / math.Sqrt(float64(cols)))
		for i := range m.Scale {
			m.Scale[i] = s * (0.5 + r.Float32())
		}
	default: // bf16-exact float32
		m.F32 = d.bf16Draw(key, rows*cols, cols)
	}
	d.blocks[key] = m
	return m
}

// bf16Draw is the first n values of the bf16 block keyed key with cols
// columns: block's draw, which periodicBF16 repeats for its period.
func (d *dummySource) bf16Draw(key string, n, cols int) []float32 {
	return bf16Rand(d.rng(key), n, float32(1/math.Sqrt(float64(cols))), 0)
}

func itoa(n int) string {
	if n == 0 {
		return "0"
	}
	var b [20]byte
	i := len(b)
	for ; n > 0; n /= 10 {
		i--
		b[i] = byte('0' + n%10)
	}
	return string(b[i:])
}

// periodicBF16 (periodic): the bf16 tensors past bf16Period values, the
// 2-D ones that Get and Linear take from a "bf16" or "embed" block, repeat
// that block's first bf16Period values, drawn here alone (the same draws,
// so the same values).
func (d *dummySource) periodicBF16(name string) ([]float32, int, int, bool) {
	s, ok := d.specs[name]
	if !ok || len(s.Shape) != 2 {
		return nil, 0, 0, false
	}
	rows, cols := s.Shape[0], s.Shape[1]
	kind := "bf16"
	switch {
	case name == model.EmbedTokensName || strings.HasSuffix(name, ".embed_tokens.weight"):
		kind = "embed"
	case s.Quantized(d.cfg) || strings.HasSuffix(name, "norm.weight") || strings.HasSuffix(name, "bias"):
		return nil, 0, 0, false
	}
	if rows*cols <= bf16Period {
		return nil, 0, 0, false
	}
	key := blockKey(kind, rows, cols, false)
	d.mu.Lock()
	defer d.mu.Unlock()
	if m, ok := d.blocks[key]; ok {
		return m.F32[:bf16Period], rows, cols, true
	}
	if p, ok := d.periods[key]; ok {
		return p, rows, cols, true
	}
	p := d.bf16Draw(key, bf16Period, cols)
	d.periods[key] = p
	return p, rows, cols, true
}

func (d *dummySource) Linear(name string, rows, cols int) (*Matrix, error) {
	s, ok := d.specs[name]
	if !ok {
		return nil, errors.Newf("dummy weights: no tensor %q in the model", name)
	}
	if len(s.Shape) != 2 || s.Shape[0] != rows || s.Shape[1] != cols {
		return nil, errors.Newf("dummy weights: %s has shape %v, want [%d %d]", name, s.Shape, rows, cols)
	}
	if s.Quantized(d.cfg) {
		return d.block("fp8", rows, cols, false), nil
	}
	return d.block("bf16", rows, cols, false), nil
}

func (d *dummySource) Expert(layer, e int, proj string, rows, cols int) (*Matrix, error) {
	g, u, dn := model.Layer(layer).Expert(e)
	name := map[string]string{"gate_proj": g, "up_proj": u, "down_proj": dn}[proj]
	if name == "" {
		return nil, errors.Newf("unknown expert projection %q", proj)
	}
	return d.Linear(name, rows, cols)
}

func (d *dummySource) Absorbed(layer int) (*Matrix, *Matrix, error) {
	c := d.cfg
	if c.Quant == nil {
		return d.block("bf16", c.NumHeads*c.QKNopeHeadDim, c.KVLoraRank, false), d.block("bf16", c.NumHeads*c.VHeadDim, c.KVLoraRank, false), nil
	}
	return d.block("fp8", c.NumHeads*c.QKNopeHeadDim, c.KVLoraRank, true), d.block("fp8", c.NumHeads*c.VHeadDim, c.KVLoraRank, true), nil
}

func (d *dummySource) Get(name string) (*model.Tensor, error) {
	s, ok := d.specs[name]
	if !ok {
		return nil, errors.Newf("dummy weights: no tensor %q in the model", name)
	}
	n := 1
	for _, x := range s.Shape {
		n *= x
	}
	var data []float32
	switch {
	case strings.HasSuffix(name, "norm.weight"):
		data = bf16Rand(d.rng(name), n, 0.05, 1)
	case strings.HasSuffix(name, "bias"):
		data = bf16Rand(d.rng(name), n, 0.01, 0)
	case name == model.EmbedTokensName || strings.HasSuffix(name, ".embed_tokens.weight"):
		data = d.block("embed", s.Shape[0], s.Shape[1], false).F32
	case len(s.Shape) == 2:
		data = d.block("bf16", s.Shape[0], s.Shape[1], false).F32
	default:
		data = bf16Rand(d.rng(name), n, 0.05, 0)
	}
	return &model.Tensor{Name: name, Shape: s.Shape, Data: data}, nil
}

// CopyGBps measures the device's copy rate (bytes read plus written per
// second, in GB/s) with back-to-back device-to-device copies of 1 GiB, the
// ceiling a decode step's byte floor is held against. The median of reps.
func (g *Engine) CopyGBps(reps int) (float64, error) { return copyGBps(g.m.r, reps) }

// copyGBps is CopyGBps on r's device.
func copyGBps(r runner, reps int) (float64, error) {
	const n = 1 << 30
	var gbps float64
	err := r.run(func(b device) error {
		cb, ok := b.(*cudaDevice)
		if !ok {
			return errors.New("CopyGBps needs the GPU backend")
		}
		c, s := cb.c, cb.s
		src, err := c.Alloc(n)
		if err != nil {
			return err
		}
		defer func() { _ = c.Free(src) }()
		dst, err := c.Alloc(n)
		if err != nil {
			return err
		}
		defer func() { _ = c.Free(dst) }()
		e0, err := c.NewEvent()
		if err != nil {
			return err
		}
		defer c.DestroyEvent(e0)
		e1, err := c.NewEvent()
		if err != nil {
			return err
		}
		defer c.DestroyEvent(e1)
		ts := make([]float64, max(reps, 3))
		for i := -1; i < len(ts); i++ { // one warm-up copy
			if err := c.Record(e0, s); err != nil {
				return err
			}
			if err := c.CopyDtoD(dst, src, n, s); err != nil {
				return err
			}
			if err := c.Record(e1, s); err != nil {
				return err
			}
			if err := c.EventSync(e1); err != nil {
				return err
			}
			ms, err := c.Elapsed(e0, e1)
			if err != nil {
				return err
			}
			if i >= 0 {
				ts[i] = float64(ms)
			}
		}
		sort.Float64s(ts)
		gbps = 2 * n / (ts[len(ts)/2] * 1e-3) / 1e9
		return nil
	})
	return gbps, err
}
