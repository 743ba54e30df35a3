package cpu

import (
	"log/slog"

	"github.com/cockroachdb/errors"

	"github.com/tilert-go/tilert/model"
)

// linear is an nn.Linear weight (Out x In, row-major), y = W x.
type linear struct {
	w       []float32
	out, in int
}

type expert struct{ gate, up, down linear }

// layerW holds one decoder block's float32 weights (main or MTP).
type layerW struct {
	idx              int
	inNorm, postNorm []float32

	qa     linear
	qaNorm []float32
	qb     linear
	kva    linear
	kvaNrm []float32
	kvb    linear // (heads*(nope+v)) x kv_lora_rank
	o      linear

	hasIdx     bool
	iwq, iwk   linear
	iknW, iknB []float32
	iwp        linear

	moe                  bool
	gate, up, down       linear // dense MLP
	router               linear
	bias                 []float32
	experts              []expert
	hasShared            bool
	shGate, shUp, shDown linear

	// MTP block extras
	mtp          bool
	enorm, hnorm []float32
	eh           linear
	shNorm       []float32
	head         linear // shared_head.head, or lm_head when absent
	embed        []float32
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
	nh := c.NumHeads
	qk := c.QKNopeHeadDim + c.QKRopeHeadDim
	for i := 0; i < c.NumAllLayers(); i++ {
		n := model.Layer(i)
		lw := &layerW{idx: i, mtp: c.IsMTPLayer(i), moe: c.IsMoELayer(i), hasIdx: c.HasIndexer(i)}
		lw.inNorm = l.get(n.InputNorm, H)
		lw.postNorm = l.get(n.PostAttnNorm, H)
		lw.qa = l.lin(n.QAProj, c.QLoraRank, H)
		lw.qaNorm = l.get(n.QANorm, c.QLoraRank)
		lw.qb = l.lin(n.QBProj, nh*qk, c.QLoraRank)
		lw.kva = l.lin(n.KVAProj, c.KVLoraRank+c.QKRopeHeadDim, H)
		lw.kvaNrm = l.get(n.KVANorm, c.KVLoraRank)
		lw.kvb = l.lin(n.KVBProj, nh*(c.QKNopeHeadDim+c.VHeadDim), c.KVLoraRank)
		lw.o = l.lin(n.OProj, H, nh*c.VHeadDim)
		if lw.hasIdx {
			lw.iwq = l.lin(n.IdxWQB, c.IndexNHeads*c.IndexHeadDim, c.QLoraRank)
			lw.iwk = l.lin(n.IdxWK, c.IndexHeadDim, H)
			lw.iknW = l.get(n.IdxKNormWeight, c.IndexHeadDim)
			lw.iknB = l.get(n.IdxKNormBias, c.IndexHeadDim)
			lw.iwp = l.lin(n.IdxWeightsProj, c.IndexNHeads, H)
		}
		if lw.moe {
			E, I := c.NRoutedExperts, c.MoEIntermediateSize
			lw.router = l.lin(n.Router, E, H)
			lw.bias = l.get(n.RouterBias, E)
			lw.experts = make([]expert, E)
			for e := 0; e < E; e++ {
				g, u, d := n.Expert(e)
				lw.experts[e] = expert{gate: l.lin(g, I, H), up: l.lin(u, I, H), down: l.lin(d, H, I)}
			}
			if c.NSharedExperts > 0 {
				si := I * c.NSharedExperts
				lw.hasShared = true
				lw.shGate, lw.shUp, lw.shDown = l.lin(n.SharedGate, si, H), l.lin(n.SharedUp, si, H), l.lin(n.SharedDown, H, si)
			}
		} else {
			I := c.IntermediateSize
			lw.gate, lw.up, lw.down = l.lin(n.GateProj, I, H), l.lin(n.UpProj, I, H), l.lin(n.DownProj, H, I)
		}
		if lw.mtp {
			lw.enorm = l.get(n.ENorm, H)
			lw.hnorm = l.get(n.HNorm, H)
			lw.eh = l.lin(n.EHProj, H, 2*H)
			lw.shNorm = l.get(n.SharedHeadNorm, H)
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
