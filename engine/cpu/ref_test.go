package cpu

import (
	"math"
	"sort"
	"testing"

	"github.com/tilert-go/tilert/engine"
	"github.com/tilert-go/tilert/engine/internal/enginetest"
	"github.com/tilert-go/tilert/engine/internal/golden"
	"github.com/tilert-go/tilert/model"
)

// refModel is a float64 re-implementation that follows HF transformers'
// deepseek_v32 / glm_moe_dsa modeling code structurally: whole-sequence
// forward without a cache, keys and values expanded through kv_b_proj (no
// absorption), RoPE outputs de-interleaved as HF writes them, the indexer
// as a dense score matrix with a causal mask, the router as HF's. It shares
// no code with the engine, so agreement checks the engine's reformulations
// (absorbed MLA, caches, in-place RoPE, batching).
type refModel struct {
	t   testing.TB
	c   *model.Config
	w   model.Weights
	inv []float64
	af  float64
}

func newRef(t testing.TB, l loaded) *refModel {
	return &refModel{t: t, c: l.cfg, w: l.w, inv: l.cfg.RopeInvFreq(), af: l.cfg.RopeAttentionFactor()}
}

func (m *refModel) get(name string) []float32 {
	x, err := m.w.Get(name)
	if err != nil {
		m.t.Fatal(err)
	}
	return x.Data
}

// lin computes W x for W (out x in).
func (m *refModel) lin(name string, x []float64) []float64 {
	w := m.get(name)
	in := len(x)
	out := make([]float64, len(w)/in)
	for o := range out {
		var s float64
		for i, v := range x {
			s += float64(w[o*in+i]) * v
		}
		out[o] = s
	}
	return out
}

func (m *refModel) rms(name string, x []float64, eps float64) []float64 {
	w := m.get(name)
	var ss float64
	for _, v := range x {
		ss += v * v
	}
	r := 1 / math.Sqrt(ss/float64(len(x))+eps)
	out := make([]float64, len(x))
	for i, v := range x {
		out[i] = float64(w[i]) * v * r
	}
	return out
}

func (m *refModel) cs(pos int) (cos, sin []float64) {
	cos, sin = make([]float64, len(m.inv)), make([]float64, len(m.inv))
	for i, f := range m.inv {
		cos[i] = math.Cos(f*float64(pos)) * m.af
		sin[i] = math.Sin(f*float64(pos)) * m.af
	}
	return
}

// ropeInterleaveHF: evens/odds rotated, output concatenated (HF layout).
func ropeInterleaveHF(x, cos, sin []float64) []float64 {
	h := len(cos)
	out := make([]float64, 2*h)
	for i := 0; i < h; i++ {
		a, b := x[2*i], x[2*i+1]
		out[i] = a*cos[i] - b*sin[i]
		out[h+i] = b*cos[i] + a*sin[i]
	}
	return out
}

// ropeHalfHF: x*cos + rotate_half(x)*sin with cos = cat(freqs, freqs).
func ropeHalfHF(x, cos, sin []float64) []float64 {
	h := len(cos)
	out := make([]float64, 2*h)
	for i := 0; i < 2*h; i++ {
		var rh float64
		if i < h {
			rh = -x[i+h]
		} else {
			rh = x[i-h]
		}
		out[i] = x[i]*cos[i%h] + rh*sin[i%h]
	}
	return out
}

func dot64(a, b []float64) float64 {
	var s float64
	for i := range a {
		s += a[i] * b[i]
	}
	return s
}

// layer runs decoder block li over the whole sequence x (S x hidden).
// prevTopK carries the indexer selection for GLM shared layers.
func (m *refModel) layer(li int, x [][]float64, prevTopK [][]bool) [][]bool {
	c := m.c
	n := model.Layer(li)
	S := len(x)
	R, P, NH, nope, vd := c.KVLoraRank, c.QKRopeHeadDim, c.NumHeads, c.QKNopeHeadDim, c.VHeadDim
	qkd := nope + P
	hs := make([][]float64, S)
	qs := make([][][]float64, S)
	ks := make([][][]float64, S)
	vs := make([][][]float64, S)
	qr := make([][]float64, S)
	for s := 0; s < S; s++ {
		h := m.rms(n.InputNorm, x[s], c.RMSNormEps)
		hs[s] = h
		qr[s] = m.rms(n.QANorm, m.lin(n.QAProj, h), 1e-6)
		q := m.lin(n.QBProj, qr[s])
		kv := m.lin(n.KVAProj, h)
		ckv := m.rms(n.KVANorm, kv[:R], 1e-6)
		cos, sin := m.cs(s)
		krot := ropeInterleaveHF(kv[R:], cos, sin)
		kvb := m.lin(n.KVBProj, ckv)
		qs[s], ks[s], vs[s] = make([][]float64, NH), make([][]float64, NH), make([][]float64, NH)
		for hd := 0; hd < NH; hd++ {
			qh := q[hd*qkd : (hd+1)*qkd]
			qs[s][hd] = append(append([]float64{}, qh[:nope]...), ropeInterleaveHF(qh[nope:], cos, sin)...)
			b := kvb[hd*(nope+vd) : (hd+1)*(nope+vd)]
			ks[s][hd] = append(append([]float64{}, b[:nope]...), krot...)
			vs[s][hd] = b[nope:]
		}
	}
	// indexer
	allowed := prevTopK
	if c.HasIndexer(li) {
		IH, ID := c.IndexNHeads, c.IndexHeadDim
		iq := make([][][]float64, S)
		ik := make([][]float64, S)
		iw := make([][]float64, S)
		for s := 0; s < S; s++ {
			cos, sin := m.cs(s)
			rope := ropeHalfHF
			if c.IndexerRopeInterleave {
				rope = ropeInterleaveHF
			}
			q := m.lin(n.IdxWQB, qr[s])
			iq[s] = make([][]float64, IH)
			for hd := 0; hd < IH; hd++ {
				qh := q[hd*ID : (hd+1)*ID]
				iq[s][hd] = append(rope(qh[:P], cos, sin), qh[P:]...)
			}
			k := m.lin(n.IdxWK, hs[s])
			var mean, vr float64
			for _, v := range k {
				mean += v
			}
			mean /= float64(ID)
			for _, v := range k {
				vr += (v - mean) * (v - mean)
			}
			vr /= float64(ID)
			kw, kb := m.get(n.IdxKNormWeight), m.get(n.IdxKNormBias)
			for i := range k {
				k[i] = (k[i]-mean)/math.Sqrt(vr+1e-6)*float64(kw[i]) + float64(kb[i])
			}
			ik[s] = append(rope(k[:P], cos, sin), k[P:]...)
			w := m.lin(n.IdxWeightsProj, hs[s])
			for i := range w {
				w[i] *= math.Pow(float64(IH), -0.5)
			}
			iw[s] = w
		}
		allowed = make([][]bool, S)
		topk := min(c.IndexTopK, S)
		for s := 0; s < S; s++ {
			sc := make([]float64, S)
			for t := 0; t < S; t++ {
				if t > s {
					sc[t] = math.Inf(-1)
					continue
				}
				for hd := 0; hd < IH; hd++ {
					sc[t] += iw[s][hd] * math.Max(dot64(iq[s][hd], ik[t])*math.Pow(float64(ID), -0.5), 0)
				}
			}
			idx := make([]int, S)
			for i := range idx {
				idx[i] = i
			}
			sort.SliceStable(idx, func(a, b int) bool { return sc[idx[a]] > sc[idx[b]] })
			allowed[s] = make([]bool, S)
			for _, t := range idx[:topk] {
				allowed[s][t] = t <= s
			}
		}
	}
	scale := c.SoftmaxScale()
	oproj := make([][]float64, S)
	for s := 0; s < S; s++ {
		o := make([]float64, NH*vd)
		for hd := 0; hd < NH; hd++ {
			a := make([]float64, S)
			mx := math.Inf(-1)
			for t := 0; t < S; t++ {
				if !allowed[s][t] {
					a[t] = math.Inf(-1)
					continue
				}
				a[t] = dot64(qs[s][hd], ks[t][hd]) * scale
				mx = math.Max(mx, a[t])
			}
			var z float64
			for t := range a {
				a[t] = math.Exp(a[t] - mx)
				z += a[t]
			}
			for t := range a {
				for j := 0; j < vd; j++ {
					o[hd*vd+j] += a[t] / z * vs[t][hd][j]
				}
			}
		}
		oproj[s] = m.lin(n.OProj, o)
	}
	for s := 0; s < S; s++ {
		for i := range x[s] {
			x[s][i] += oproj[s][i]
		}
		h2 := m.rms(n.PostAttnNorm, x[s], c.RMSNormEps)
		var y []float64
		if c.IsMoELayer(li) {
			y = m.moe(n, h2)
		} else {
			y = m.mlp(n.GateProj, n.UpProj, n.DownProj, h2)
		}
		for i := range x[s] {
			x[s][i] += y[i]
		}
	}
	return allowed
}

func (m *refModel) mlp(g, u, d string, x []float64) []float64 {
	gv, uv := m.lin(g, x), m.lin(u, x)
	for i := range gv {
		gv[i] = gv[i] / (1 + math.Exp(-gv[i])) * uv[i]
	}
	return m.lin(d, gv)
}

func (m *refModel) moe(n model.LayerNames, h []float64) []float64 {
	c := m.c
	E := c.NRoutedExperts
	lg := m.lin(n.Router, h)
	bias := m.get(n.RouterBias)
	s, ch := make([]float64, E), make([]float64, E)
	for i := range lg {
		s[i] = 1 / (1 + math.Exp(-lg[i]))
		ch[i] = s[i] + float64(bias[i])
	}
	per := E / c.NGroup
	type gsc struct {
		g int
		v float64
	}
	gs := make([]gsc, c.NGroup)
	for g := range gs {
		v := append([]float64{}, ch[g*per:(g+1)*per]...)
		sort.Sort(sort.Reverse(sort.Float64Slice(v)))
		gs[g] = gsc{g, v[0] + v[1]}
	}
	sort.SliceStable(gs, func(a, b int) bool { return gs[a].v > gs[b].v })
	for _, g := range gs[c.TopKGroup:] {
		for j := g.g * per; j < (g.g+1)*per; j++ {
			ch[j] = math.Inf(-1)
		}
	}
	idx := make([]int, E)
	for i := range idx {
		idx[i] = i
	}
	sort.SliceStable(idx, func(a, b int) bool { return ch[idx[a]] > ch[idx[b]] })
	idx = idx[:c.NumExpertsPerTok]
	var sum float64
	for _, j := range idx {
		sum += s[j]
	}
	out := m.mlp(n.SharedGate, n.SharedUp, n.SharedDown, h)
	for _, j := range idx {
		w := s[j]
		if c.NormTopKProb {
			w /= sum + 1e-20
		}
		w *= c.RoutedScalingFactor
		g, u, d := n.Expert(j)
		y := m.mlp(g, u, d, h)
		for i := range out {
			out[i] += w * y[i]
		}
	}
	return out
}

// forward returns logits and final-normed hiddens for every position of toks.
func (m *refModel) forward(toks []int) (logits, hidden [][]float64) {
	c := m.c
	H := c.HiddenSize
	emb := m.get(model.EmbedTokensName)
	x := make([][]float64, len(toks))
	for s, t := range toks {
		x[s] = make([]float64, H)
		for i := range x[s] {
			x[s][i] = float64(emb[t*H+i])
		}
	}
	var tk [][]bool
	for li := 0; li < c.NumLayers; li++ {
		tk = m.layer(li, x, tk)
	}
	head := model.LMHeadName
	if c.TieWordEmbeddings {
		head = model.EmbedTokensName
	}
	for s := range x {
		h := m.rms(model.FinalNormName, x[s], c.RMSNormEps)
		hidden = append(hidden, h)
		logits = append(logits, m.lin(head, h))
	}
	return
}

// mtp returns MTP logits at every position j fed (hidden[j], next[j]).
func (m *refModel) mtp(hidden [][]float64, next []int) [][]float64 {
	c := m.c
	L := c.NumLayers
	n := model.Layer(L)
	H := c.HiddenSize
	emb := m.get(model.EmbedTokensName)
	if _, err := m.w.Get(n.MTPEmbed); err == nil {
		emb = m.get(n.MTPEmbed)
	}
	head := model.LMHeadName
	if _, err := m.w.Get(n.SharedHeadHead); err == nil {
		head = n.SharedHeadHead
	}
	x := make([][]float64, len(next))
	for j, t := range next {
		e := make([]float64, H)
		for i := range e {
			e[i] = float64(emb[t*H+i])
		}
		cat := append(m.rms(n.ENorm, e, c.RMSNormEps), m.rms(n.HNorm, hidden[j], c.RMSNormEps)...)
		x[j] = m.lin(n.EHProj, cat)
	}
	m.layer(L, x, nil)
	var out [][]float64
	for j := range x {
		out = append(out, m.lin(head, m.rms(n.SharedHeadNorm, x[j], c.RMSNormEps)))
	}
	return out
}

// teacherForce runs toks through the engine (fresh slot 0, exact or
// serving) and returns main logits at every position plus MTP logits at
// every position j fed (hidden_j, toks[j+1]).
func teacherForce(t testing.TB, e *Engine, toks []int) (logits, mtp [][]float32) {
	if err := e.CheckFree(0); err != nil {
		t.Fatal(err)
	}
	s := e.m.slots[0]
	var hidden [][]float32
	for lo := 0; lo < len(toks); lo += prefillChunk {
		hi := min(lo+prefillChunk, len(toks))
		rows := make([]row, hi-lo)
		for i := range rows {
			rows[i] = row{s: s, tok: toks[lo+i], pos: lo + i}
		}
		h, lg := e.m.forwardMain(rows, nil)
		hidden = append(hidden, h...)
		logits = append(logits, lg...)
	}
	if e.m.hasMTP() {
		rows := make([]row, len(toks)-1)
		for j := range rows {
			rows[j] = row{s: s, tok: toks[j+1], pos: j, h: hidden[j]}
		}
		for lo := 0; lo < len(rows); lo += prefillChunk {
			hi := min(lo+prefillChunk, len(rows))
			mtp = append(mtp, e.m.forwardMTP(rows[lo:hi], nil)...)
		}
	}
	return
}

func TestEngineMatchesFloat64Reference(t *testing.T) {
	for _, pr := range enginetest.Presets {
		t.Run(pr, func(t *testing.T) {
			l := loadPreset(t, pr)
			ref := newRef(t, l)
			e := newEngine(t, pr, engine.Options{Mode: engine.ModeExact, MaxSeqLen: 256})
			// 80 tokens: well past index_topk (32), so the indexer selects.
			toks := enginetest.Prompt(80, l.cfg.VocabSize, 3)
			gotL, gotM := teacherForce(t, e, toks)
			wantL, hid := ref.forward(toks)
			wantM := ref.mtp(hid[:len(toks)-1], toks[1:])
			var worst, worstM float64
			for s := range toks {
				worst = math.Max(worst, golden.RelErr(gotL[s], wantL[s]))
			}
			for j := range wantM {
				worstM = math.Max(worstM, golden.RelErr(gotM[j], wantM[j]))
			}
			t.Logf("max rel logit err: main %.3g, mtp %.3g", worst, worstM)
			if worst > 1e-4 || worstM > 1e-4 {
				t.Errorf("engine differs from the float64 reference: main %.3g mtp %.3g", worst, worstM)
			}
		})
	}
}
