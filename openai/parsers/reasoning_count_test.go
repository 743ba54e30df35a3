package parsers

import "testing"

func TestReasoningCounter(t *testing.T) {
	const s, e = 7, 8
	for _, c := range []struct {
		name     string
		parser   string
		thinking bool
		ids      []int
		want     int
	}{
		{"a block", "glm45", false, []int{s, 1, 2, 3, e, 4, 5}, 3},
		{"no block", "glm45", false, []int{1, 2, 3}, 0},
		{"opened by the prompt (vLLM reads the generated ids only)", "deepseek_r1", true, []int{1, 2, e, 3}, 0},
		{"nested", "glm45", false, []int{s, 1, s, 2, e, 3, e, 4}, 3},
		{"stray end", "glm45", false, []int{e, 1, s, 2, e}, 1},
		{"unclosed", "deepseek_r1", false, []int{s, 1, 2}, 2},
		{"deepseek_v3 without thinking: the identity parser", "deepseek_v3", false, []int{s, 1, 2, e}, 0},
		{"deepseek_v3 with thinking: R1's rule", "deepseek_v3", true, []int{s, 1, 2, e, 3}, 2},
	} {
		t.Run(c.name, func(t *testing.T) {
			r := NewReasoningCounter(c.parser, c.thinking, s, e)
			for _, id := range c.ids {
				r.Add(id)
			}
			if r.Tokens() != c.want {
				t.Errorf("%v: %d reasoning tokens, want %d", c.ids, r.Tokens(), c.want)
			}
		})
	}
	if r := NewReasoningCounter("glm45", false, -1, e); func() int { r.Add(1); r.Add(e); return r.Tokens() }() != 0 {
		t.Errorf("without a start id the count must stay 0")
	}
}
