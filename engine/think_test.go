package engine

import "testing"

// The budget's rule, token by token: Budget tokens in a block, then End
// forced to its end; a block the model closes ends the count; a new block
// counts afresh; a block the prompt opened counts its prompt tokens.
func TestThinkBudget(t *testing.T) {
	const S, E, E2 = 100, 101, 102 // start, end (one id, or two: E E2)
	for _, tc := range []struct {
		name string
		b    ThinkBudget
		gen  []int
		want int
	}{
		{"prompt opened, budget 0: the first token is forced", ThinkBudget{Budget: 0, Start: []int{S}, End: []int{E}, PromptInThink: true}, nil, E},
		{"prompt opened, under budget", ThinkBudget{Budget: 3, Start: []int{S}, End: []int{E}, PromptInThink: true}, []int{1, 2}, -1},
		{"prompt opened, budget reached", ThinkBudget{Budget: 3, Start: []int{S}, End: []int{E}, PromptInThink: true}, []int{1, 2, 3}, E},
		{"prompt tokens count", ThinkBudget{Budget: 3, Start: []int{S}, End: []int{E}, PromptInThink: true, PromptCount: 2}, []int{1}, E},
		{"after the forced end: free", ThinkBudget{Budget: 1, Start: []int{S}, End: []int{E}, PromptInThink: true}, []int{1, E}, -1},
		{"closed by the model: free", ThinkBudget{Budget: 3, Start: []int{S}, End: []int{E}}, []int{S, 1, E, 2, 3, 4, 5}, -1},
		{"a block the model opens", ThinkBudget{Budget: 2, Start: []int{S}, End: []int{E}}, []int{7, S, 1, 2}, E},
		{"a second block counts afresh", ThinkBudget{Budget: 2, Start: []int{S}, End: []int{E}}, []int{S, 1, E, 5, S, 1}, -1},
		{"the second block's budget", ThinkBudget{Budget: 2, Start: []int{S}, End: []int{E}}, []int{S, 1, E, 5, S, 1, 2}, E},
		{"no block", ThinkBudget{Budget: 0, Start: []int{S}, End: []int{E}}, []int{1, 2, 3}, -1},
		{"two-id end: the first forced", ThinkBudget{Budget: 2, Start: []int{S}, End: []int{E, E2}, PromptInThink: true}, []int{1, 2}, E},
		{"two-id end: then its second", ThinkBudget{Budget: 2, Start: []int{S}, End: []int{E, E2}, PromptInThink: true}, []int{1, 2, E}, E2},
		{"two-id end: done", ThinkBudget{Budget: 2, Start: []int{S}, End: []int{E, E2}, PromptInThink: true}, []int{1, 2, E, E2, 9}, -1},
		{"two-id end begun by the model under budget: not forced", ThinkBudget{Budget: 5, Start: []int{S}, End: []int{E, E2}, PromptInThink: true}, []int{1, E}, -1},
	} {
		if got := tc.b.Next(tc.gen); got != tc.want {
			t.Errorf("%s: Next(%v) = %d, want %d", tc.name, tc.gen, got, tc.want)
		}
	}
}

// Forcing goes through the adjustments both engines apply: the forced id's
// logit wins arg-max and takes the whole probability when sampling; a draft
// being verified counts as generated.
func TestThinkBudgetForces(t *testing.T) {
	p := Params{Think: &ThinkBudget{Budget: 2, Start: []int{3}, End: []int{4}, PromptInThink: true}, Temperature: 0.9, TopP: 0.95, Seed: 1}
	h := NewTokenHistory(nil)
	h.Add(7)
	for _, a := range p.Adjustments(h, -1) {
		if a.Bias != 0 || a.Block {
			t.Fatalf("one token in a budget of two: %+v", a)
		}
	}
	adj := p.Adjustments(h, 8) // the draft 8 makes two
	row := []float32{5, 4, 3, -2, -7, 1}
	ApplyAdjust(row, adj)
	if Argmax(row) != 4 {
		t.Fatalf("forced: arg-max %d of %v", Argmax(row), row)
	}
	for pos := range 50 {
		if got := Sample(row, p, pos); got != 4 {
			t.Fatalf("sampled %d at %d, want the forced 4", got, pos)
		}
	}
}

// A prompt leaves a block open when its last start comes after its last end.
func TestNewThinkBudget(t *testing.T) {
	for _, tc := range []struct {
		prompt []int
		in     bool
		count  int
	}{
		{[]int{1, 2, 3}, false, 0},
		{[]int{1, 100}, true, 0},
		{[]int{100, 5, 6}, true, 2},
		{[]int{100, 5, 101, 7}, false, 0},
		{[]int{100, 5, 101, 100, 9}, true, 1},
		{[]int{101, 100}, true, 0},
	} {
		b := NewThinkBudget(4, []int{100}, []int{101}, tc.prompt)
		if b.PromptInThink != tc.in || b.PromptCount != tc.count || b.Budget != 4 {
			t.Errorf("prompt %v: in %v count %d, want %v %d", tc.prompt, b.PromptInThink, b.PromptCount, tc.in, tc.count)
		}
	}
	if b := NewThinkBudget(1, []int{7, 8}, []int{9}, []int{1, 7, 8, 2}); !b.PromptInThink || b.PromptCount != 1 {
		t.Errorf("two-id start: %+v", b)
	}
}

// A forced end of thinking wins over a bad word, as vLLM forces last.
func TestThinkBudgetOverBadWords(t *testing.T) {
	p := Params{Think: &ThinkBudget{Budget: 0, Start: []int{3}, End: []int{4}, PromptInThink: true}, BadWords: [][]int{{4}}}
	row := []float32{5, 4, 3, -2, -7}
	ApplyAdjust(row, p.Adjustments(NewTokenHistory(nil), -1))
	if Argmax(row) != 4 {
		t.Fatalf("arg-max %d of %v, want the forced 4", Argmax(row), row)
	}
}
