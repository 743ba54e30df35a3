package engine

import (
	"math"
	"sort"
)

// Sampling controls users set beside temperature/top-k/top-p, as vLLM
// applies them: bad words blocked and logits processors first (logit_bias
// added, stop ids blocked until min_tokens are generated), then the penalties (repetition over
// prompt and generated tokens: a positive logit divided by it, a negative
// one multiplied; frequency times the generated count and presence once
// for a generated token, subtracted), then temperature, min_p, top-k, top-p
// and the draw.
// Logprobs are of the raw logits (vLLM's default raw_logprobs), before all
// of this.
//
// Both engines turn a slot's rules into the same list of LogitAdjust
// entries and apply each with the same float32 arithmetic (ApplyAdjust
// here, the adjust_logits kernel on the GPU), so the adjusted logits are
// bit-identical.

// TokenHistory is what the penalties read: the prompt's ids and how often
// each token has been generated (the first token included), and the
// generated tokens in order, which bad words are matched against.
type TokenHistory struct {
	prompt map[int]bool
	counts map[int]int
	n      int
	gen    []int
}

// NewTokenHistory starts a history for a prompt (nil when no repetition
// penalty needs it).
func NewTokenHistory(prompt []int) *TokenHistory {
	h := &TokenHistory{prompt: make(map[int]bool, len(prompt)), counts: map[int]int{}}
	for _, t := range prompt {
		h.prompt[t] = true
	}
	return h
}

// Add records a generated token.
func (h *TokenHistory) Add(tok int) {
	h.counts[tok]++
	h.n++
	h.gen = append(h.gen, tok)
}

// sequence is the generated tokens, and extra after them when >= 0 (a
// draft being verified); h may be nil (no tokens yet).
func (h *TokenHistory) sequence(extra int) []int {
	var gen []int
	if h != nil {
		gen = h.gen
	}
	if extra >= 0 {
		gen = append(gen[:len(gen):len(gen)], extra)
	}
	return gen
}

// Generated is the number of tokens added.
func (h *TokenHistory) Generated() int { return h.n }

// LogitAdjust is one logit changed before a token is chosen.
type LogitAdjust struct {
	Tok   int
	Bias  float32 // added first (logit_bias)
	Block bool    // then -inf (a stop id before min_tokens, a bad word's last id)
	Rep   float32 // then divided (positive logit) or multiplied (else) when != 1
	Sub   float32 // then subtracted (frequency * count + presence)
}

// Adjusts reports whether p changes logits at all.
func (p Params) Adjusts() bool {
	return p.PresencePenalty != 0 || p.FrequencyPenalty != 0 || (p.RepetitionPenalty != 0 && p.RepetitionPenalty != 1) ||
		p.MinTokens > 0 || len(p.LogitBias) > 0 || len(p.BadWords) > 0 || p.Think != nil
}

// Adjustments lists the logit changes p asks for when choosing the next
// token after h's tokens and, when extra >= 0, one more generated token
// extra (an MTP draft being verified), sorted by token id.
func (p Params) Adjustments(h *TokenHistory, extra int) []LogitAdjust {
	if !p.Adjusts() {
		return nil
	}
	generated := 0
	count := func(t int) int { return 0 }
	if h != nil {
		generated = h.n
		count = func(t int) int { return h.counts[t] }
	}
	if extra >= 0 {
		generated++
		base := count
		count = func(t int) int {
			if t == extra {
				return base(t) + 1
			}
			return base(t)
		}
	}
	m := map[int]*LogitAdjust{}
	get := func(t int) *LogitAdjust {
		a, ok := m[t]
		if !ok {
			a = &LogitAdjust{Tok: t, Rep: 1}
			m[t] = a
		}
		return a
	}
	for t, b := range p.LogitBias {
		get(t).Bias = b
	}
	if generated < p.MinTokens {
		for _, t := range p.StopIDs {
			get(t).Block = true
		}
	}
	var gen []int
	if len(p.BadWords) > 0 || p.Think != nil {
		gen = h.sequence(extra)
	}
	for _, w := range p.BadWords {
		if bad := badWordNext(w, gen); bad >= 0 {
			get(bad).Block = true
		}
	}
	if p.Think != nil {
		if t := p.Think.Next(gen); t >= 0 {
			// vLLM forces after every other rule: a bad word does not
			// keep the end of a thinking block out.
			a := get(t)
			a.Bias, a.Block = ForceBias, false
		}
	}
	rep := p.RepetitionPenalty != 0 && p.RepetitionPenalty != 1
	if h != nil {
		if rep {
			for t := range h.prompt {
				get(t).Rep = float32(p.RepetitionPenalty)
			}
		}
		for t := range h.counts {
			p.penalize(get(t), count(t), rep)
		}
	}
	if extra >= 0 && (h == nil || h.counts[extra] == 0) {
		p.penalize(get(extra), count(extra), rep)
	}
	out := make([]LogitAdjust, 0, len(m))
	for _, a := range m {
		out = append(out, *a)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Tok < out[j].Tok })
	return out
}

// badWordNext is the id a bad word w blocks after the generated tokens gen:
// w's last id when gen ends with the ids before it (vLLM matches the
// generated tokens only, never the prompt), else -1.
func badWordNext(w, gen []int) int {
	if len(w) == 0 || len(w)-1 > len(gen) {
		return -1
	}
	pre := w[:len(w)-1]
	tail := gen[len(gen)-len(pre):]
	for i := range pre {
		if tail[i] != pre[i] {
			return -1
		}
	}
	return w[len(w)-1]
}

func (p Params) penalize(a *LogitAdjust, n int, rep bool) {
	if n == 0 {
		return
	}
	if rep {
		a.Rep = float32(p.RepetitionPenalty)
	}
	a.Sub = float32(p.FrequencyPenalty*float64(n) + p.PresencePenalty)
}

// ApplyAdjust applies adjustments to one row of logits, in place.
func ApplyAdjust(row []float32, adj []LogitAdjust) {
	for _, a := range adj {
		if a.Tok < 0 || a.Tok >= len(row) {
			continue
		}
		v := row[a.Tok] + a.Bias
		if a.Block {
			v = float32(math.Inf(-1))
		} else {
			if a.Rep != 1 {
				if v > 0 {
					v /= a.Rep
				} else {
					v *= a.Rep
				}
			}
			v -= a.Sub
		}
		row[a.Tok] = v
	}
}

// TopLogprob is one alternative token and its logprob.
type TopLogprob struct {
	ID      int
	Logprob float32
}

// TokenLogprobs is a chosen token's logprob and the most likely
// alternatives, most likely first (ties by lower id).
type TokenLogprobs struct {
	Logprob float32
	Top     []TopLogprob
}

// Logprobs is the log-softmax of raw logits at tok, and the k most likely
// tokens, computed in float64 (the GPU kernel in float32 agrees to ~1e-5).
// NaN logits are left out of the sum and the alternatives.
func Logprobs(row []float32, tok, k int) TokenLogprobs {
	mx := math.Inf(-1)
	for _, v := range row {
		if v == v {
			mx = math.Max(mx, float64(v))
		}
	}
	var s float64
	for _, v := range row {
		if v == v {
			s += math.Exp(float64(v) - mx)
		}
	}
	lse := mx + math.Log(s)
	out := TokenLogprobs{Logprob: float32(float64(row[tok]) - lse)}
	if k <= 0 {
		return out
	}
	idx := make([]int, 0, k+1)
	for i, v := range row {
		if v != v {
			continue
		}
		// Insert into the k best so far (value desc, id asc).
		j := len(idx)
		for j > 0 && (row[idx[j-1]] < v) {
			j--
		}
		if j >= k {
			continue
		}
		idx = append(idx, 0)
		copy(idx[j+1:], idx[j:])
		idx[j] = i
		if len(idx) > k {
			idx = idx[:k]
		}
	}
	for _, i := range idx {
		out.Top = append(out.Top, TopLogprob{ID: i, Logprob: float32(float64(row[i]) - lse)})
	}
	return out
}
