package cpu

import (
	"math"

	"github.com/tilert-go/tilert/engine"
	"github.com/tilert-go/tilert/engine/internal/kern"
	"github.com/tilert-go/tilert/model"
)

// row is one position forwarded through the model: token tok of slot s at
// position pos. h is the MTP input hidden (final-normed main hidden of the
// previous position) for MTP rows.
type row struct {
	s   *slot
	tok int
	pos int
	h   []float32
}

// subEps is the epsilon of q_a_layernorm and kv_a_layernorm: HF builds them
// with the RMSNorm default (1e-6), not config.rms_norm_eps.
const subEps = 1e-6

// indexerNormEps is the indexer k_norm LayerNorm epsilon (HF and vLLM: 1e-6).
const indexerNormEps = 1e-6

// matmulRows is y = x W^T for M rows.
func matmulRows(x []float32, M int, l linear) []float32 {
	out := make([]float32, M*l.out)
	kern.MatMul(out, x, l.w, M, l.out, l.in)
	return out
}

// forwardMain runs rows through the main layers. It returns each row's
// final-normed hidden state and, for rows with wantLogits[i], the logits.
// Rows of the same slot must be in increasing consecutive positions; every
// row's caches are written before any row attends, and a row attends only
// to positions <= its own, so the result equals forwarding rows one by one.
func (e *backend) forwardMain(rows []row, wantLogits []bool) (hidden, logits [][]float32) {
	c := e.cfg
	H, M := c.HiddenSize, len(rows)
	x := make([]float32, M*H)
	for i, r := range rows {
		copy(x[i*H:(i+1)*H], e.w.embed[r.tok*H:(r.tok+1)*H])
	}
	topk := make([][]int, M)
	for li := 0; li < c.NumLayers; li++ {
		e.block(e.w.layers[li], x, rows, topk)
	}
	hidden = make([][]float32, M)
	logits = make([][]float32, M)
	for i := range rows {
		h := make([]float32, H)
		kern.RMSNorm(h, x[i*H:(i+1)*H], e.w.norm, c.RMSNormEps)
		hidden[i] = h
	}
	e.head(e.w.head, hidden, wantLogits, logits)
	return hidden, logits
}

func (e *backend) head(head linear, hidden [][]float32, want []bool, logits [][]float32) {
	var sel []int
	for i := range hidden {
		if want == nil || want[i] {
			sel = append(sel, i)
		}
	}
	if len(sel) == 0 {
		return
	}
	H := e.cfg.HiddenSize
	x := make([]float32, len(sel)*H)
	for j, i := range sel {
		copy(x[j*H:], hidden[i])
	}
	out := matmulRows(x, len(sel), head)
	for j, i := range sel {
		logits[i] = out[j*head.out : (j+1)*head.out]
	}
}

// forwardMTP runs rows (token, previous hidden) through the MTP layer and
// returns logits for rows with wantLogits[i].
func (e *backend) forwardMTP(rows []row, wantLogits []bool) [][]float32 {
	c := e.cfg
	lw := e.w.layers[c.NumLayers]
	H, M := c.HiddenSize, len(rows)
	cat := make([]float32, M*2*H)
	for i, r := range rows {
		kern.RMSNorm(cat[i*2*H:i*2*H+H], lw.embed[r.tok*H:(r.tok+1)*H], lw.ENorm, c.RMSNormEps)
		kern.RMSNorm(cat[i*2*H+H:(i+1)*2*H], r.h, lw.HNorm, c.RMSNormEps)
	}
	x := matmulRows(cat, M, lw.EH)
	topk := make([][]int, M)
	e.block(lw, x, rows, topk)
	hidden := make([][]float32, M)
	for i := range rows {
		h := make([]float32, H)
		kern.RMSNorm(h, x[i*H:(i+1)*H], lw.ShNorm, c.RMSNormEps)
		hidden[i] = h
	}
	logits := make([][]float32, M)
	e.head(lw.head, hidden, wantLogits, logits)
	return logits
}

// block is one decoder layer over M rows, updating x (M x hidden) in place.
// topk carries each row's indexer selection to GLM "shared" layers.
func (e *backend) block(lw *layerW, x []float32, rows []row, topk [][]int) {
	c := e.cfg
	H, M := c.HiddenSize, len(rows)
	h := make([]float32, M*H)
	for i := 0; i < M; i++ {
		kern.RMSNorm(h[i*H:(i+1)*H], x[i*H:(i+1)*H], lw.InNorm, c.RMSNormEps)
	}
	attn := e.attention(lw, h, rows, topk)
	kern.Add(x, attn)
	for i := 0; i < M; i++ {
		kern.RMSNorm(h[i*H:(i+1)*H], x[i*H:(i+1)*H], lw.PostNorm, c.RMSNormEps)
	}
	var mlp []float32
	if lw.MoE {
		mlp = e.moe(lw, h, M)
	} else {
		mlp = ffn(h, M, lw.Gate, lw.Up, lw.Down)
	}
	kern.Add(x, mlp)
}

// ffn is down(silu(gate x) * up x) for M rows.
func ffn(x []float32, M int, gate, up, down linear) []float32 {
	g := matmulRows(x, M, gate)
	u := matmulRows(x, M, up)
	kern.SiLUMul(g, g, u)
	return matmulRows(g, M, down)
}

func (e *backend) rope(pos int, cos, sin []float32) { e.ropeTab.CosSin(pos, cos, sin) }

// attention is absorbed MLA with the DSA indexer over M rows (input: the
// input-normed hidden h, M x hidden); it returns o_proj's output.
func (e *backend) attention(lw *layerW, h []float32, rows []row, topk [][]int) []float32 {
	c := e.cfg
	H, M := c.HiddenSize, len(rows)
	R, P := c.KVLoraRank, c.QKRopeHeadDim
	NH, nope, vd := c.NumHeads, c.QKNopeHeadDim, c.VHeadDim
	qk := nope + P
	half := P / 2
	cos, sin := make([]float32, half), make([]float32, half)

	qa := matmulRows(h, M, lw.QA)
	QL := c.QLoraRank
	for i := 0; i < M; i++ {
		kern.RMSNorm(qa[i*QL:(i+1)*QL], qa[i*QL:(i+1)*QL], lw.QANorm, subEps)
	}
	q := matmulRows(qa, M, lw.QB)
	kva := matmulRows(h, M, lw.KVA)
	applyRope := kern.ApplyInterleaved
	if !c.RopeInterleave {
		applyRope = kern.ApplyHalf
	}
	for i, r := range rows {
		e.rope(r.pos, cos, sin)
		kv := kva[i*(R+P) : (i+1)*(R+P)]
		kern.RMSNorm(kv[:R], kv[:R], lw.KVANorm, subEps)
		applyRope(kv[R:], cos, sin)
		r.s.caches[lw.Idx].writeMLA(r.pos, kv[:R], kv[R:])
		for hd := 0; hd < NH; hd++ {
			applyRope(q[i*NH*qk+hd*qk+nope:i*NH*qk+(hd+1)*qk], cos, sin)
		}
	}

	// DSA indexer: pick the positions each row attends to.
	if lw.HasIdx {
		e.indexer(lw, h, qa, rows, topk)
	}

	out := make([]float32, M*NH*vd)
	scale := float32(e.softmaxScale)
	kvbStride := nope + vd
	for i, r := range rows {
		sel := topk[i]
		T := r.pos + 1
		if sel == nil {
			sel = make([]int, T)
			for t := range sel {
				sel[t] = t
			}
		}
		n := len(sel)
		lat := make([]float32, n*R)
		rp := make([]float32, n*P)
		cache := r.s.caches[lw.Idx]
		for j, t := range sel {
			cache.readMLA(t, lat[j*R:(j+1)*R], rp[j*P:(j+1)*P])
		}
		qi := q[i*NH*qk : (i+1)*NH*qk]
		oi := out[i*NH*vd : (i+1)*NH*vd]
		kern.ParallelFor(NH, n*(R+P)*2+R*(nope+vd), func(lo, hi int) {
			qlat := make([]float32, R)
			olat := make([]float32, R)
			sc := make([]float32, n)
			for hd := lo; hd < hi; hd++ {
				qn := qi[hd*qk : hd*qk+nope]
				qp := qi[hd*qk+nope : (hd+1)*qk]
				// q_nope absorbed through W_UK: qlat = W_UK[hd]^T q_nope
				for k := range qlat {
					qlat[k] = 0
				}
				base := hd * kvbStride
				for d := 0; d < nope; d++ {
					kern.Axpy(qlat, qn[d], lw.kvb.w[(base+d)*R:(base+d+1)*R])
				}
				for j := 0; j < n; j++ {
					sc[j] = (kern.Dot(qlat, lat[j*R:(j+1)*R]) + kern.Dot(qp, rp[j*P:(j+1)*P])) * scale
				}
				kern.Softmax(sc)
				for k := range olat {
					olat[k] = 0
				}
				for j := 0; j < n; j++ {
					kern.Axpy(olat, sc[j], lat[j*R:(j+1)*R])
				}
				// output through W_UV
				for v := 0; v < vd; v++ {
					oi[hd*vd+v] = kern.Dot(lw.kvb.w[(base+nope+v)*R:(base+nope+v+1)*R], olat)
				}
			}
		})
	}
	_ = H
	return matmulRows(out, M, lw.O)
}

// indexer runs the lightning indexer: writes each row's key into the cache
// and sets topk[i] to the selected positions, or nil when the row attends to
// every causal position (pos+1 <= index_topk).
func (e *backend) indexer(lw *layerW, h, qr []float32, rows []row, topk [][]int) {
	c := e.cfg
	M := len(rows)
	P, IH, ID := c.QKRopeHeadDim, c.IndexNHeads, c.IndexHeadDim
	half := P / 2
	cos, sin := make([]float32, half), make([]float32, half)
	applyRope := kern.ApplyHalf
	if c.IndexerRopeInterleave {
		applyRope = kern.ApplyInterleaved
	}
	iq := matmulRows(qr, M, lw.IWQ)
	ik := matmulRows(h, M, lw.IWK)
	wts := matmulRows(h, M, lw.IWP)
	wscale := float32(math.Pow(float64(IH), -0.5))
	for i, r := range rows {
		e.rope(r.pos, cos, sin)
		k := ik[i*ID : (i+1)*ID]
		kern.LayerNorm(k, k, lw.IKNormW, lw.IKNormB, indexerNormEps)
		applyRope(k[:P], cos, sin)
		r.s.caches[lw.Idx].writeIdx(r.pos, k)
		for hd := 0; hd < IH; hd++ {
			qh := iq[i*IH*ID+hd*ID : i*IH*ID+(hd+1)*ID]
			applyRope(qh[:P], cos, sin)
			if e.opts.Mode == engine.ModeServing {
				// vLLM quantises the indexer query to fp8 (ue8m0 scale per 128).
				engine.QuantFP8UE8M0(qh)
			}
		}
		kern.Scale(wts[i*IH:(i+1)*IH], wscale)
	}
	sm := float32(c.IndexerSoftmaxScale())
	for i, r := range rows {
		T := r.pos + 1
		if T <= c.IndexTopK {
			topk[i] = nil
			continue
		}
		cache := r.s.caches[lw.Idx]
		qi := iq[i*IH*ID : (i+1)*IH*ID]
		wi := wts[i*IH : (i+1)*IH]
		scores := make([]float32, T)
		kern.ParallelFor(T, IH*ID, func(lo, hi int) {
			kt := make([]float32, ID)
			for t := lo; t < hi; t++ {
				cache.readIdx(t, kt)
				var s float32
				for hd := 0; hd < IH; hd++ {
					d := kern.Dot(qi[hd*ID:(hd+1)*ID], kt) * sm
					if d > 0 {
						s += wi[hd] * d
					}
				}
				scores[t] = s
			}
		})
		topk[i] = kern.TopK(scores, c.IndexTopK)
		if e.indexerHook != nil {
			e.indexerHook(lw.Idx, r.pos, scores, topk[i])
		}
	}
}

// moe is the routed experts plus shared expert(s) for M rows of h.
func (e *backend) moe(lw *layerW, h []float32, M int) []float32 {
	c := e.cfg
	H, E, K := c.HiddenSize, c.NRoutedExperts, c.NumExpertsPerTok
	logits := matmulRows(h, M, lw.Router)
	type pick struct {
		row, e int
		w      float32
	}
	picks := make([]pick, 0, M*K)
	for i := 0; i < M; i++ {
		idx, w := route(logits[i*E:(i+1)*E], lw.Bias, c)
		for k := range idx {
			picks = append(picks, pick{row: i, e: idx[k], w: w[k]})
		}
	}
	outs := make([][]float32, len(picks))
	I := c.MoEIntermediateSize
	kern.ParallelFor(len(picks), 3*I*H, func(lo, hi int) {
		for j := lo; j < hi; j++ {
			p := picks[j]
			ex := lw.experts[p.e]
			x := h[p.row*H : (p.row+1)*H]
			g, u := make([]float32, I), make([]float32, I)
			// single-row products through the same Dot as MatMul
			for n := 0; n < I; n++ {
				g[n] = kern.Dot(x, ex.gate.w[n*H:(n+1)*H])
				u[n] = kern.Dot(x, ex.up.w[n*H:(n+1)*H])
			}
			kern.SiLUMul(g, g, u)
			o := make([]float32, H)
			for n := 0; n < H; n++ {
				o[n] = kern.Dot(g, ex.down.w[n*I:(n+1)*I])
			}
			outs[j] = o
		}
	})
	out := make([]float32, M*H)
	for j, p := range picks {
		kern.Axpy(out[p.row*H:(p.row+1)*H], p.w, outs[j])
	}
	if lw.HasShared {
		kern.Add(out, ffn(h, M, lw.ShGate, lw.ShUp, lw.ShDown))
	}
	return out
}

// route is the sigmoid router with e_score_correction_bias used for
// selection only: DeepSeek group-limited top-k (groups ranked by the sum of
// their top-2 biased scores, keep topk_group) reduces to plain top-k when
// n_group is 1 (GLM-5). Weights are the chosen unbiased sigmoid scores,
// normalised when norm_topk_prob, times routed_scaling_factor.
func route(logits, bias []float32, c *model.Config) ([]int, []float32) {
	E := len(logits)
	s := make([]float32, E)
	choice := make([]float32, E)
	for i, v := range logits {
		s[i] = kern.Sigmoid(v)
		choice[i] = s[i] + bias[i]
	}
	if c.NGroup > 1 {
		per := E / c.NGroup
		gs := make([]float32, c.NGroup)
		for g := 0; g < c.NGroup; g++ {
			t := kern.TopK(choice[g*per:(g+1)*per], 2)
			for _, j := range t {
				gs[g] += choice[g*per+j]
			}
		}
		keep := make([]bool, c.NGroup)
		for _, g := range kern.TopK(gs, c.TopKGroup) {
			keep[g] = true
		}
		for g := 0; g < c.NGroup; g++ {
			if !keep[g] {
				for j := g * per; j < (g+1)*per; j++ {
					choice[j] = float32(math.Inf(-1))
				}
			}
		}
	}
	idx := kern.TopK(choice, c.NumExpertsPerTok)
	w := make([]float32, len(idx))
	var sum float32
	for k, j := range idx {
		w[k] = s[j]
		sum += s[j]
	}
	if c.NormTopKProb {
		sum += 1e-20
		for k := range w {
			w[k] /= sum
		}
	}
	for k := range w {
		w[k] *= float32(c.RoutedScalingFactor)
	}
	return idx, w
}
