package cpu

import (
	"log/slog"

	"github.com/cockroachdb/errors"

	"github.com/tilert-go/tilert/engine/internal/blockw"
	"github.com/tilert-go/tilert/model"
)

// linear is an nn.Linear weight (Out x In, row-major), y = W x.
type linear struct {
	w       []float32
	out, in int
}

type expert struct{ gate, up, down linear }

// layerW holds one decoder block's float32 weights (main or MTP): the
// shared part (blockw) plus kv_b_proj, the routed experts and the MTP
// layer's head and embedding.
type layerW struct {
	*blockw.Block[linear, []float32]
	kvb     linear // (heads*(nope+v)) x kv_lora_rank
	experts []expert
	head    linear    // MTP: shared_head.head, or lm_head when absent
	embed   []float32 // MTP: its embedding, or embed_tokens when absent
}

type weights struct {
	embed  []float32 // vocab x hidden
	norm   []float32
	head   linear
	layers []*layerW // main layers then MTP layers
}

type loader struct {
	w   model.Weights
	err error
}

func (l *loader) get(name string, shape ...int) []float32 {
	if l.err != nil {
		return nil
	}
	t, err := l.w.Get(name)
	if err != nil {
		l.err = errors.Wrapf(err, "engine weights")
		return nil
	}
	n := 1
	for _, s := range shape {
		n *= s
	}
	if len(t.Data) != n {
		l.err = errors.Newf("tensor %s: %d values (shape %v), want shape %v", name, len(t.Data), t.Shape, shape)
		return nil
	}
	return t.Data
}

func (l *loader) lin(name string, out, in int) linear {
	return linear{w: l.get(name, out, in), out: out, in: in}
}

// Lin and Vec make loader a blockw.Loader.
func (l *loader) Lin(name string, out, in int) linear { return l.lin(name, out, in) }
func (l *loader) Vec(name string, n int) []float32    { return l.get(name, n) }

// optional returns the tensor or nil when it cannot be read (MTP copies of
// the embedding and head are optional in checkpoints).
func (l *loader) optional(name string, shape ...int) []float32 {
	if l.err != nil {
		return nil
	}
	t, err := l.w.Get(name)
	if err != nil {
		slog.Debug("optional tensor absent", "name", name, "err", err)
		return nil
	}
	n := 1
	for _, s := range shape {
		n *= s
	}
	if len(t.Data) != n {
		l.err = errors.Newf("tensor %s: shape %v, want %v", name, t.Shape, shape)
		return nil
	}
	return t.Data
}

func loadWeights(c *model.Config, src model.Weights) (*weights, error) {
	l := &loader{w: src}
	H, V := c.HiddenSize, c.VocabSize
	w := &weights{
		embed: l.get(model.EmbedTokensName, V, H),
		norm:  l.get(model.FinalNormName, H),
	}
	if c.TieWordEmbeddings {
		w.head = linear{w: w.embed, out: V, in: H}
	} else {
		w.head = l.lin(model.LMHeadName, V, H)
	}
	for i := 0; i < c.NumAllLayers(); i++ {
		n := model.Layer(i)
		lw := &layerW{Block: blockw.Load(c, i, blockw.Loader[linear, []float32](l))}
		lw.kvb = l.lin(n.KVBProj, c.NumHeads*(c.QKNopeHeadDim+c.VHeadDim), c.KVLoraRank)
		if lw.MoE {
			E, I := c.NRoutedExperts, c.MoEIntermediateSize
			lw.experts = make([]expert, E)
			for e := 0; e < E; e++ {
				g, u, d := n.Expert(e)
				lw.experts[e] = expert{gate: l.lin(g, I, H), up: l.lin(u, I, H), down: l.lin(d, H, I)}
			}
		}
		if lw.MTP {
			if hw := l.optional(n.SharedHeadHead, V, H); hw != nil {
				lw.head = linear{w: hw, out: V, in: H}
			} else {
				lw.head = w.head
			}
			if ew := l.optional(n.MTPEmbed, V, H); ew != nil {
				lw.embed = ew
			} else {
				lw.embed = w.embed
			}
		}
		w.layers = append(w.layers, lw)
	}
	if l.err != nil {
		return nil, l.err
	}
	return w, nil
}
