package kern

import (
	"math"

	"github.com/tilert-go/tilert/model"
)

// Rope holds per-position cos/sin tables for a rotary embedding of dimension
// Dim (Dim/2 frequencies), already multiplied by the attention scaling factor
// the way HF's rotary embedding does (cos*attention_scaling).
type Rope struct {
	Dim     int
	InvFreq []float32
	Scale   float32 // attention_scaling applied to cos and sin
}

// RopeParams describes the rotary embedding; Type "" or "default" is plain
// RoPE, "yarn" is YaRN as implemented by HF transformers
// (_compute_yarn_parameters): truncated correction range, linear ramp,
// attention factor mscale(factor,mscale)/mscale(factor,mscale_all_dim) when
// both are set, else 0.1*ln(factor)+1.
type RopeParams struct {
	Type                  string
	Theta                 float64
	Factor                float64
	OriginalMaxPosition   float64
	BetaFast, BetaSlow    float64
	MScale, MScaleAllDim  float64
	AttentionFactor       float64 // explicit override; 0 = derive
	MaxPositionEmbeddings float64
	NoTruncate            bool
}

func yarnMScale(scale, m float64) float64 {
	if scale <= 1 {
		return 1
	}
	return 0.1*m*math.Log(scale) + 1
}

// NewRope computes the inverse frequencies in float32 the way torch does
// (base ** (arange(0,dim,2)/dim) evaluated in float32).
func NewRope(dim int, p RopeParams) *Rope {
	half := dim / 2
	pos := make([]float32, half)
	for i := range pos {
		e := float32(2*i) / float32(dim)
		pos[i] = float32(math.Pow(p.Theta, float64(e)))
	}
	r := &Rope{Dim: dim, InvFreq: make([]float32, half), Scale: 1}
	switch p.Type {
	case "", "default":
		for i := range pos {
			r.InvFreq[i] = 1 / pos[i]
		}
	case "yarn", "deepseek_yarn":
		factor := p.Factor
		if factor == 0 {
			factor = p.MaxPositionEmbeddings / p.OriginalMaxPosition
		}
		af := p.AttentionFactor
		if af == 0 {
			if p.MScale != 0 && p.MScaleAllDim != 0 {
				af = yarnMScale(factor, p.MScale) / yarnMScale(factor, p.MScaleAllDim)
			} else {
				af = yarnMScale(factor, 1)
			}
		}
		r.Scale = float32(af)
		bf, bs := p.BetaFast, p.BetaSlow
		if bf == 0 {
			bf = 32
		}
		if bs == 0 {
			bs = 1
		}
		corr := func(rot float64) float64 {
			return float64(dim) * math.Log(p.OriginalMaxPosition/(rot*2*math.Pi)) / (2 * math.Log(p.Theta))
		}
		low, high := corr(bf), corr(bs)
		if !p.NoTruncate {
			low, high = math.Floor(low), math.Ceil(high)
		}
		low = math.Max(low, 0)
		high = math.Min(high, float64(dim-1))
		if low == high {
			high += 0.001
		}
		for i := range pos {
			ramp := (float32(i) - float32(low)) / (float32(high) - float32(low))
			ramp = min(max(ramp, 0), 1)
			extra := 1 - ramp // extrapolation weight
			interp := 1 / (float32(factor) * pos[i])
			extrap := 1 / pos[i]
			r.InvFreq[i] = interp*(1-extra) + extrap*extra
		}
	default:
		panic("kern.NewRope: unsupported rope type " + p.Type)
	}
	return r
}

// CosSin fills cos/sin (len Dim/2) for position pos, scaled.
func (r *Rope) CosSin(pos int, cos, sin []float32) {
	for i, f := range r.InvFreq {
		a := f * float32(pos) // float32 product as in HF (inv_freq @ position_ids in fp32)
		cos[i] = float32(math.Cos(float64(a))) * r.Scale
		sin[i] = float32(math.Sin(float64(a))) * r.Scale
	}
}

// ApplyInterleaved rotates pairs (x[2i], x[2i+1]) in place by frequency i.
// HF de-interleaves the output (evens then odds); vLLM keeps pairs in place.
// Dot products between two vectors rotated the same way are identical, and
// the in-place order is the one vLLM writes into its caches.
func ApplyInterleaved(x, cos, sin []float32) {
	for i := range cos {
		a, b := x[2*i], x[2*i+1]
		x[2*i] = a*cos[i] - b*sin[i]
		x[2*i+1] = b*cos[i] + a*sin[i]
	}
}

// ApplyHalf rotates (x[i], x[i+d/2]) in place (NeoX / rotate_half style).
func ApplyHalf(x, cos, sin []float32) {
	h := len(cos)
	for i := 0; i < h; i++ {
		a, b := x[i], x[i+h]
		x[i] = a*cos[i] - b*sin[i]
		x[i+h] = b*cos[i] + a*sin[i]
	}
}

// RopeParamsOf is cfg's rotary embedding.
func RopeParamsOf(cfg *model.Config) RopeParams {
	return RopeParams{
		Type: cfg.Rope.Type, Theta: cfg.RopeTheta, Factor: cfg.Rope.Factor,
		OriginalMaxPosition: float64(cfg.Rope.OriginalMaxPositionEmbeddings),
		BetaFast:            cfg.Rope.BetaFast, BetaSlow: cfg.Rope.BetaSlow,
		MScale: cfg.Rope.Mscale, MScaleAllDim: cfg.Rope.MscaleAllDim,
		AttentionFactor:       cfg.Rope.AttentionFactor,
		MaxPositionEmbeddings: float64(cfg.MaxPositionEmbeddings),
		NoTruncate:            !cfg.Rope.Truncate,
	}
}
