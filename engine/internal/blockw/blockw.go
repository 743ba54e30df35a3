// Package blockw reads one decoder block's weights the way every engine
// backend needs them, into the backend's own representation: L for a
// linear weight [out][in], V for a vector. Backends add what they store
// their own way (kv_b_proj or its absorbed halves, the routed experts, the
// MTP layer's head and embedding).
package blockw

import "github.com/tilert-go/tilert/model"

// Block is one decoder block's weights (a main layer or an MTP layer).
type Block[L, V any] struct {
	Idx                  int
	MTP, MoE, HasIdx     bool
	InNorm, PostNorm     V
	QA, QB, KVA, O       L // attention projections (kv_b_proj is the backend's)
	QANorm, KVANorm      V
	IWQ, IWK, IWP        L // the DSA indexer's projections
	IKNormW, IKNormB     V // its key LayerNorm
	Gate, Up, Down       L // dense MLP
	InterSize            int
	Router               L // MoE router (mlp.gate) and its bias
	Bias                 V
	HasShared            bool
	ShGate, ShUp, ShDown L // shared experts
	SharedInterSize      int
	ENorm, HNorm, ShNorm V // MTP: embedding norm, hidden norm, shared-head norm
	EH                   L // MTP: eh_proj
}

// Loader reads tensors by HF name, checking their shape; it remembers its
// first error itself.
type Loader[L, V any] interface {
	Lin(name string, out, in int) L
	Vec(name string, n int) V
}

// Load reads block i of c through ld.
func Load[L, V any](c *model.Config, i int, ld Loader[L, V]) *Block[L, V] {
	n := model.Layer(i)
	H, nh := c.HiddenSize, c.NumHeads
	qk := c.QKNopeHeadDim + c.QKRopeHeadDim
	b := &Block[L, V]{Idx: i, MTP: c.IsMTPLayer(i), MoE: c.IsMoELayer(i), HasIdx: c.HasIndexer(i)}
	b.InNorm = ld.Vec(n.InputNorm, H)
	b.PostNorm = ld.Vec(n.PostAttnNorm, H)
	b.QA = ld.Lin(n.QAProj, c.QLoraRank, H)
	b.QANorm = ld.Vec(n.QANorm, c.QLoraRank)
	b.QB = ld.Lin(n.QBProj, nh*qk, c.QLoraRank)
	b.KVA = ld.Lin(n.KVAProj, c.KVLoraRank+c.QKRopeHeadDim, H)
	b.KVANorm = ld.Vec(n.KVANorm, c.KVLoraRank)
	b.O = ld.Lin(n.OProj, H, nh*c.VHeadDim)
	if b.HasIdx {
		b.IWQ = ld.Lin(n.IdxWQB, c.IndexNHeads*c.IndexHeadDim, c.QLoraRank)
		b.IWK = ld.Lin(n.IdxWK, c.IndexHeadDim, H)
		b.IKNormW = ld.Vec(n.IdxKNormWeight, c.IndexHeadDim)
		b.IKNormB = ld.Vec(n.IdxKNormBias, c.IndexHeadDim)
		b.IWP = ld.Lin(n.IdxWeightsProj, c.IndexNHeads, H)
	}
	if b.MoE {
		E, I := c.NRoutedExperts, c.MoEIntermediateSize
		b.Router = ld.Lin(n.Router, E, H)
		b.Bias = ld.Vec(n.RouterBias, E)
		if c.NSharedExperts > 0 {
			si := I * c.NSharedExperts
			b.HasShared, b.SharedInterSize = true, si
			b.ShGate, b.ShUp, b.ShDown = ld.Lin(n.SharedGate, si, H), ld.Lin(n.SharedUp, si, H), ld.Lin(n.SharedDown, H, si)
		}
	} else {
		I := c.IntermediateSize
		b.InterSize = I
		b.Gate, b.Up, b.Down = ld.Lin(n.GateProj, I, H), ld.Lin(n.UpProj, I, H), ld.Lin(n.DownProj, H, I)
	}
	if b.MTP {
		b.ENorm = ld.Vec(n.ENorm, H)
		b.HNorm = ld.Vec(n.HNorm, H)
		b.EH = ld.Lin(n.EHProj, H, 2*H)
		b.ShNorm = ld.Vec(n.SharedHeadNorm, H)
	}
	return b
}
