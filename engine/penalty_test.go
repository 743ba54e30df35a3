package engine

import (
	"math"
	"math/rand/v2"
	"reflect"
	"sort"
	"testing"
)

// The adjustments reproduce vLLM's rules written out directly: bias, block
// before min_tokens, repetition over prompt+generated, frequency and
// presence over generated; a draft being verified counts as generated.
func TestAdjustments(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	const V = 50
	for it := 0; it < 200; it++ {
		p := Params{StopIDs: []int{1, 2}, MinTokens: r.IntN(4),
			PresencePenalty: r.Float64()*4 - 2, FrequencyPenalty: r.Float64()*4 - 2, RepetitionPenalty: []float64{1, 0.7, 1.3, 2}[r.IntN(4)]}
		if r.IntN(2) == 0 {
			p.LogitBias = map[int]float32{r.IntN(V): float32(r.Float64()*200 - 100), 1: 5}
		}
		prompt := []int{r.IntN(V), r.IntN(V), 7}
		h := NewTokenHistory(prompt)
		var gen []int
		for range r.IntN(5) {
			tk := r.IntN(V)
			h.Add(tk)
			gen = append(gen, tk)
		}
		extra := -1
		if r.IntN(2) == 0 {
			extra = r.IntN(V)
			gen = append(gen, extra)
		}
		logits := make([]float32, V)
		for i := range logits {
			logits[i] = float32(r.NormFloat64() * 3)
		}
		got := append([]float32(nil), logits...)
		ApplyAdjust(got, p.Adjustments(h, extra))

		want := append([]float32(nil), logits...)
		for tk, b := range p.LogitBias {
			want[tk] += b
		}
		counts := map[int]int{}
		for _, tk := range gen {
			counts[tk]++
		}
		seen := map[int]bool{}
		for _, tk := range prompt {
			seen[tk] = true
		}
		for tk := range counts {
			seen[tk] = true
		}
		for tk := 0; tk < V; tk++ {
			v := want[tk]
			if len(gen) < p.MinTokens && (tk == 1 || tk == 2) {
				want[tk] = float32(math.Inf(-1))
				continue
			}
			if seen[tk] && p.RepetitionPenalty != 1 {
				if v > 0 {
					v /= float32(p.RepetitionPenalty)
				} else {
					v *= float32(p.RepetitionPenalty)
				}
			}
			if n := counts[tk]; n > 0 {
				v -= float32(p.FrequencyPenalty*float64(n) + p.PresencePenalty)
			}
			want[tk] = v
		}
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("iteration %d (%+v, gen %v extra %d):\n got %v\nwant %v", it, p, gen, extra, got, want)
		}
	}
	if (Params{RepetitionPenalty: 1}).Adjustments(NewTokenHistory([]int{1}), 3) != nil {
		t.Fatal("no rules set but adjustments made")
	}
}

func TestLogprobs(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	row := make([]float32, 1000)
	for i := range row {
		row[i] = float32(math.Round(r.NormFloat64()*8) / 4) // many ties
	}
	row[17] = float32(math.NaN())
	row[18] = float32(math.Inf(-1))
	lp := Logprobs(row, 5, 20)
	var s float64
	mx := math.Inf(-1)
	for _, v := range row {
		if v == v {
			mx = math.Max(mx, float64(v))
		}
	}
	_ = s
	idx := []int{}
	for i, v := range row {
		if v == v {
			idx = append(idx, i)
		}
	}
	sort.SliceStable(idx, func(a, b int) bool { return row[idx[a]] > row[idx[b]] })
	if len(lp.Top) != 20 {
		t.Fatalf("%d alternatives", len(lp.Top))
	}
	for j, a := range lp.Top {
		if a.ID != idx[j] {
			t.Fatalf("alternative %d is %d, want %d", j, a.ID, idx[j])
		}
		if d := float64(a.Logprob-lp.Logprob) - float64(row[a.ID]-row[5]); math.Abs(d) > 1e-5 {
			t.Fatalf("logprob differences off by %g", d)
		}
	}
	// A row without NaN normalises: sum of exp(logprob) is 1.
	clean := row[:17]
	var sum float64
	for i := range clean {
		sum += math.Exp(float64(Logprobs(clean, i, 0).Logprob))
	}
	if math.Abs(sum-1) > 1e-5 {
		t.Fatalf("probabilities sum to %g", sum)
	}
}

// Bad words as vLLM's apply_bad_words: a sequence's last id is blocked when
// the generated tokens (a draft being verified included, the prompt never)
// end with the ids before it; one-id words always.
func TestBadWords(t *testing.T) {
	words := [][]int{{9}, {4, 5}, {1, 2, 3}}
	for _, tc := range []struct {
		name   string
		prompt []int
		gen    []int
		extra  int
		want   []int // blocked ids
	}{
		{"first token", []int{4, 1, 2}, nil, -1, []int{9}},
		{"two-id word after its first id", nil, []int{7, 4}, -1, []int{5, 9}},
		{"three ids, two generated", nil, []int{1, 2}, -1, []int{3, 9}},
		{"three ids, the draft completes the prefix", nil, []int{1}, 2, []int{3, 9}},
		{"the draft breaks the prefix", nil, []int{1, 2}, 8, []int{9}},
		{"the prompt does not count", []int{1}, []int{2}, -1, []int{9}},
		{"an earlier match does not block", nil, []int{4, 6}, -1, []int{9}},
	} {
		h := NewTokenHistory(tc.prompt)
		for _, tk := range tc.gen {
			h.Add(tk)
		}
		p := Params{BadWords: words}
		if !p.Adjusts() {
			t.Fatalf("%s: bad words do not adjust logits", tc.name)
		}
		var got []int
		for _, a := range p.Adjustments(h, tc.extra) {
			if a.Block {
				got = append(got, a.Tok)
			}
		}
		if !reflect.DeepEqual(got, tc.want) {
			t.Errorf("%s: blocked %v, want %v", tc.name, got, tc.want)
		}
		row := make([]float32, 12)
		for i := range row {
			row[i] = 1
		}
		ApplyAdjust(row, p.Adjustments(h, tc.extra))
		for _, id := range tc.want {
			if !math.IsInf(float64(row[id]), -1) {
				t.Errorf("%s: logit %d = %v after the adjustments, want -inf", tc.name, id, row[id])
			}
		}
	}
}
