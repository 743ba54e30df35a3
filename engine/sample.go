package engine

import (
	"math"
	"sort"
)

// Uniform returns a deterministic uniform float64 in [0,1) for (seed, pos):
// a counter-based stream (splitmix64), so the draw for a position does not
// depend on how many draws came before it. That makes seeded sampling give
// the same tokens with and without MTP speculation.
func Uniform(seed uint64, pos int) float64 {
	x := seed ^ (uint64(pos)+1)*0x9E3779B97F4A7C15
	x += 0x9E3779B97F4A7C15
	x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9
	x = (x ^ (x >> 27)) * 0x94D049BB133111EB
	x ^= x >> 31
	return float64(x>>11) * (1.0 / (1 << 53))
}

// Argmax returns the index of the largest logit (first one on ties, as
// torch.argmax).
func Argmax(logits []float32) int {
	best := 0
	for i, v := range logits {
		if v > logits[best] {
			best = i
		}
	}
	return best
}

// Sample picks the token for position pos from logits under p: greedy when
// p.Temperature <= 0, else temperature, then top-k and min_p (the tokens at
// least MinP times as likely as the most likely one: both keep the most
// likely tokens, so their order does not matter), then top-p (nucleus) over
// the renormalised distribution, then an inverse-CDF draw with Uniform(p.Seed,
// pos) over the candidates sorted by probability (ties by token id).
func Sample(logits []float32, p Params, pos int) int {
	if p.Greedy() {
		return Argmax(logits)
	}
	n := len(logits)
	idx := make([]int, n)
	for i := range idx {
		idx[i] = i
	}
	sort.Slice(idx, func(a, b int) bool {
		la, lb := logits[idx[a]], logits[idx[b]]
		if la != lb {
			return la > lb
		}
		return idx[a] < idx[b]
	})
	if p.TopK > 0 && p.TopK < n {
		idx = idx[:p.TopK]
	}
	inv := 1 / p.Temperature
	mx := float64(logits[idx[0]]) * inv
	prob := make([]float64, len(idx))
	var z float64
	for i, t := range idx {
		e := math.Exp(float64(logits[t])*inv - mx)
		if p.MinP > 0 && e < p.MinP {
			// idx is sorted by logit, so every later token is less likely.
			idx, prob = idx[:i], prob[:i]
			break
		}
		prob[i] = e
		z += e
	}
	for i := range prob {
		prob[i] /= z
	}
	if p.TopP > 0 && p.TopP < 1 {
		var c float64
		keep := len(prob)
		for i, q := range prob {
			c += q
			if c >= p.TopP {
				keep = i + 1
				break
			}
		}
		idx, prob = idx[:keep], prob[:keep]
		z = 0
		for _, q := range prob {
			z += q
		}
		for i := range prob {
			prob[i] /= z
		}
	}
	u := Uniform(p.Seed, pos)
	var c float64
	for i, q := range prob {
		c += q
		if u < c {
			return idx[i]
		}
	}
	return idx[len(idx)-1]
}

// Finish says whether a sequence ends once tok is generated: tok is a stop
// id, generated (tok included) reached MaxTokens, or a sequence of seqLen
// positions has no room left under maxSeq to forward tok.
func (p Params) Finish(tok, generated, seqLen, maxSeq int) FinishReason {
	switch {
	case p.IsStop(tok):
		return FinishStop
	case p.MaxTokens > 0 && generated >= p.MaxTokens, seqLen+1 >= maxSeq:
		return FinishLength
	}
	return FinishNone
}

// IsStop reports whether tok is one of p's stop ids.
func (p Params) IsStop(tok int) bool {
	for _, s := range p.StopIDs {
		if s == tok {
			return true
		}
	}
	return false
}
