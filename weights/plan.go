package weights

import (
	"fmt"
	"slices"

	"github.com/cockroachdb/errors"

	"github.com/tilert-go/tilert/model"
	"github.com/tilert-go/tilert/numeric"
)

// Logical is one stored weight (scales excluded) as the layout defines it from the config alone:
// name, shape, device and the HF tensors it is made of. Both the converter and Verify derive the
// expected tensor set from it.
type Logical struct {
	Name   string
	Kind   Kind // KindPlain (fp8_block when stored as e4m3), KindAbsorbed or KindExperts
	Shape  []int64
	Device int
	HF     []string // plain: the tensor; absorbed: kv_b_proj; experts: the stacked experts in order
	Half   int      // absorbed: 0 = W_UK (the qk_nope rows of each head), 1 = W_UV (the v rows)
}

// Plan lists the stored weights of cfg for devices devices, with or without the MTP layers:
// every tensor every device needs (model.Specs order, kv_b_proj replaced by W_UK and W_UV, routed
// experts left out), then for each device its expert stacks, layer by layer.
func Plan(cfg *model.Config, devices int, mtp bool) ([]Logical, error) {
	if devices < 1 {
		return nil, errors.Newf("devices must be >= 1, got %d", devices)
	}
	if cfg.NRoutedExperts > 0 && devices > cfg.NRoutedExperts {
		return nil, errors.WithHint(errors.Newf("--devices %d is more than the model's %d routed experts", devices, cfg.NRoutedExperts),
			"each device must hold at least one expert; use fewer devices")
	}
	specs := model.Specs(cfg)
	var out []Logical
	type stackKey struct{ layer, proj int }
	stacks := map[stackKey][]string{}
	var moeLayers []int
	for _, s := range specs {
		if l, ok := LayerOf(s.Name); ok && cfg.IsMTPLayer(l) && !mtp {
			continue
		}
		shape := int64s(s.Shape)
		if l, e, proj, ok := ParseExpertName(s.Name); ok {
			p := slices.Index(ExpertProjs[:], proj)
			k := stackKey{l, p}
			if e == 0 && p == 0 {
				moeLayers = append(moeLayers, l)
			}
			stacks[k] = append(stacks[k], s.Name)
			continue
		}
		if l, ok := IsKVBProj(s.Name); ok {
			uk, uv := AbsorbedNames(l)
			h, kvl := int64(cfg.NumHeads), int64(cfg.KVLoraRank)
			out = append(out,
				Logical{Name: uk, Kind: KindAbsorbed, Shape: []int64{h, int64(cfg.QKNopeHeadDim), kvl}, Device: -1, HF: []string{s.Name}, Half: 0},
				Logical{Name: uv, Kind: KindAbsorbed, Shape: []int64{h, int64(cfg.VHeadDim), kvl}, Device: -1, HF: []string{s.Name}, Half: 1})
			continue
		}
		out = append(out, Logical{Name: s.Name, Kind: KindPlain, Shape: shape, Device: -1, HF: []string{s.Name}})
	}
	n := cfg.NRoutedExperts
	for d := range devices {
		lo, hi := FirstExpert(d, devices, n), FirstExpert(d+1, devices, n)
		for _, l := range moeLayers {
			for p, proj := range ExpertProjs {
				names := stacks[stackKey{l, p}]
				if len(names) != n {
					return nil, errors.AssertionFailedf("layer %d %s: %d experts listed, want %d", l, proj, len(names), n)
				}
				rows, cols := int64(cfg.MoEIntermediateSize), int64(cfg.HiddenSize)
				if proj == "down_proj" {
					rows, cols = cols, rows
				}
				out = append(out, Logical{
					Name: ExpertStackName(l, d, proj), Kind: KindExperts,
					Shape: []int64{int64(hi - lo), rows, cols}, Device: d, HF: slices.Clone(names[lo:hi]),
				})
			}
		}
	}
	return out, nil
}

// ScaleShape is the float32 scale tensor's shape for a logical weight stored as e4m3.
func (g *Logical) ScaleShape() []int64 {
	b := int64(numeric.FP8BlockSize)
	up := func(x int64) int64 { return (x + b - 1) / b }
	switch g.Kind {
	case KindAbsorbed:
		return []int64{g.Shape[0], g.Shape[1], up(g.Shape[2])}
	case KindExperts:
		return []int64{g.Shape[0], up(g.Shape[1]), up(g.Shape[2])}
	default:
		return []int64{up(g.Shape[0]), up(g.Shape[1])}
	}
}

// ScaleKind is the kind of the scale tensor of a logical weight stored as e4m3.
func (g *Logical) ScaleKind() Kind {
	if g.Kind == KindAbsorbed {
		return KindRowScale
	}
	return KindBlockScale
}

// LayerOf is the layer index of a "model.layers.{i}." tensor name.
func LayerOf(name string) (int, bool) {
	var l int
	n, err := fmt.Sscanf(name, "model.layers.%d.", &l)
	return l, err == nil && n == 1
}

func int64s(s []int) []int64 {
	o := make([]int64, len(s))
	for i, v := range s {
		o[i] = int64(v)
	}
	return o
}
