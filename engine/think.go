package engine

// ForceBias is added to a token's logit to force it: every other token's
// probability becomes 0 after any temperature, and arg-max picks it, on
// both engines (the logit stays finite, so the samplers' arithmetic holds).
// Logprobs are of the raw logits, so a forced token keeps its own.
const ForceBias = 1e30

// ThinkBudget is vLLM's thinking_token_budget: a thinking block (from the
// Start sequence to the End sequence) may hold Budget tokens; the token
// after them is forced to begin End, and End is then forced to its end. A
// block the model closes itself ends the count; a later block starts a new
// one. The prompt may leave a block open (a chat template that opens it):
// PromptInThink, with PromptCount of its tokens already in the prompt.
type ThinkBudget struct {
	Budget        int
	Start, End    []int
	PromptInThink bool
	PromptCount   int
}

// Next is the token forced after the generated tokens gen, or -1.
func (b *ThinkBudget) Next(gen []int) int {
	if len(b.End) == 0 {
		return -1
	}
	in, count := b.PromptInThink, b.PromptCount
	for i := range gen {
		done := gen[:i+1]
		switch {
		case in && hasSuffix(done, b.End):
			in = false
		case in:
			count++
		case len(b.Start) > 0 && hasSuffix(done, b.Start):
			in, count = true, 0
		}
	}
	if !in {
		return -1
	}
	// Inside a block: an End begun where the budget ran out goes on to its
	// end (its ids count as block tokens above); else End's first id once
	// the block holds Budget tokens.
	for k := len(b.End) - 1; k >= 1; k-- {
		if count-k >= b.Budget && hasSuffix(gen, b.End[:k]) {
			return b.End[k]
		}
	}
	if count >= b.Budget {
		return b.End[0]
	}
	return -1
}

func hasSuffix(s, suf []int) bool {
	if len(suf) > len(s) {
		return false
	}
	t := s[len(s)-len(suf):]
	for i := range suf {
		if t[i] != suf[i] {
			return false
		}
	}
	return true
}

// NewThinkBudget is the budget for a prompt: whether it leaves a block open
// (its last Start after its last End) and how many of the block's tokens it
// holds, as vLLM reads the prompt.
func NewThinkBudget(budget int, start, end, prompt []int) *ThinkBudget {
	b := &ThinkBudget{Budget: budget, Start: start, End: end}
	ls, le := lastIndex(prompt, start), lastIndex(prompt, end)
	if ls >= 0 && ls > le {
		b.PromptInThink, b.PromptCount = true, len(prompt)-(ls+len(start))
	}
	return b
}

// lastIndex is where seq last begins in s, or -1.
func lastIndex(s, seq []int) int {
	if len(seq) == 0 {
		return -1
	}
	for i := len(s) - len(seq); i >= 0; i-- {
		if hasSuffix(s[:i+len(seq)], seq) {
			return i
		}
	}
	return -1
}
