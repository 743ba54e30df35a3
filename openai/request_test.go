package openai

import (
	"strings"
	"testing"
)

func TestParseRequest(t *testing.T) {
	msgs := `"messages":[{"role":"user","content":"hi"}]`
	for _, tc := range []struct {
		name, body string
		chat       bool
		param, msg string // expected error; "" accepts
		check      func(*Request) bool
	}{
		{"completions defaults", `{"prompt":"hi"}`, false, "", "", func(r *Request) bool {
			return r.MaxTokens == 16 && r.RepetitionPenalty == 1 && r.SkipSpecial && !r.Logprobs && r.N == 1
		}},
		{"token prompt", `{"prompt":[[1,2,3]]}`, false, "", "", func(r *Request) bool { return r.Prompt == PromptIDs && len(r.PromptIDs) == 3 && r.Prompts == nil }},
		{"batch of texts", `{"prompt":["a","b","c"]}`, false, "", "", func(r *Request) bool { return len(r.Prompts) == 3 && r.Prompt == PromptText }},
		{"batch of ids", `{"prompt":[[1,2],[3]]}`, false, "", "", func(r *Request) bool { return len(r.Prompts) == 2 && r.Prompt == PromptIDs }},
		{"batch with an empty prompt", `{"prompt":["a",""]}`, false, "prompt", "prompt[1]: empty", nil},
		{"batch too deep", `{"prompt":[[[1]]]}`, false, "prompt", "not deeper arrays", nil},
		{"empty batch", `{"prompt":[]}`, false, "prompt", "empty", nil},
		{"max_completion_tokens wins", `{` + msgs + `,"max_tokens":5,"max_completion_tokens":7}`, true, "", "", func(r *Request) bool {
			return r.MaxTokens == 7 && r.MaxTokensParam == "max_completion_tokens"
		}},
		{"logprobs completions", `{"prompt":"hi","logprobs":3}`, false, "", "", func(r *Request) bool { return r.Logprobs && r.TopLogprobs == 3 }},
		{"logit_bias clamped", `{"prompt":"hi","logit_bias":{"7":250,"8":-300}}`, false, "", "", func(r *Request) bool {
			return r.LogitBias[7] == 100 && r.LogitBias[8] == -100
		}},
		{"tools auto by default", `{` + msgs + `,"tools":[{"type":"function","function":{"name":"f"}}]}`, true, "", "", func(r *Request) bool {
			return r.ToolChoice.Mode == ToolChoiceAuto
		}},
		{"named tool", `{` + msgs + `,"tools":[{"type":"function","function":{"name":"f"}}],"tool_choice":{"type":"function","function":{"name":"f"}}}`, true, "", "", func(r *Request) bool {
			return r.ToolChoice.Mode == ToolChoiceNamed && r.ToolChoice.Name == "f"
		}},
		{"thinking kwarg", `{` + msgs + `,"chat_template_kwargs":{"enable_thinking":true}}`, true, "", "", func(r *Request) bool {
			return r.Thinking("enable_thinking", false) && !r.Thinking("thinking", false)
		}},
		{"temperature", `{"prompt":"hi","temperature":-0.5}`, false, "temperature", "non-negative", nil},
		{"top_p 0", `{"prompt":"hi","top_p":0}`, false, "top_p", "(0, 1]", nil},
		{"presence", `{"prompt":"hi","presence_penalty":-2.1}`, false, "presence_penalty", "[-2, 2]", nil},
		{"repetition", `{"prompt":"hi","repetition_penalty":-1}`, false, "repetition_penalty", "greater than zero", nil},
		{"min_tokens", `{"prompt":"hi","min_tokens":-1}`, false, "min_tokens", "greater than or equal to 0", nil},
		{"top_logprobs", `{` + msgs + `,"logprobs":true,"top_logprobs":21}`, true, "top_logprobs", "max allowed: 20", nil},
		{"tool_choice needs tools", `{` + msgs + `,"tool_choice":"required"}`, true, "tool_choice", "needs tools", nil},
		{"bad tool", `{` + msgs + `,"tools":[{"type":"function","function":{}}]}`, true, "tools", "tools[0]", nil},
		{"n 0", `{"prompt":"hi","n":0}`, false, "n", "at least 1", nil},
		{"thinking budget", `{"prompt":"hi","thinking_token_budget":64}`, false, "", "", func(r *Request) bool { return *r.ThinkingBudget == 64 }},
		{"thinking budget unlimited", `{"prompt":"hi","thinking_token_budget":-1}`, false, "", "", func(r *Request) bool { return r.ThinkingBudget == nil }},
		{"thinking budget -2", `{"prompt":"hi","thinking_token_budget":-2}`, false, "thinking_token_budget", "non-negative integer or -1", nil},
		{"thinking budget fraction", `{"prompt":"hi","thinking_token_budget":1.5}`, false, "thinking_token_budget", "non-negative integer", nil},
		{"repetition_detection", `{"prompt":"hi","repetition_detection":{"max_pattern_size":4,"min_count":3}}`, false, "", "", func(r *Request) bool {
			return r.Repetition != nil && r.Repetition.MaxPatternSize == 4 && r.Repetition.MinCount == 3
		}},
		{"repetition_detection off", `{"prompt":"hi","repetition_detection":{"max_pattern_size":0}}`, false, "", "", func(r *Request) bool { return r.Repetition == nil }},
		{"repetition_detection min_count", `{"prompt":"hi","repetition_detection":{"max_pattern_size":4,"min_count":1}}`, false, "repetition_detection", "min_count must be >= 2", nil},
		{"repetition_detection sizes", `{"prompt":"hi","repetition_detection":{"max_pattern_size":2,"min_pattern_size":3,"min_count":2}}`, false, "repetition_detection", "min_pattern_size <= max_pattern_size", nil},
		{"repetition_detection type", `{"prompt":"hi","repetition_detection":5}`, false, "repetition_detection", "as integers", nil},
		{"min_p", `{"prompt":"hi","min_p":0.05}`, false, "", "", func(r *Request) bool { return r.MinP != nil && *r.MinP == 0.05 }},
		{"min_p range", `{"prompt":"hi","min_p":1.5}`, false, "min_p", "min_p must be in [0, 1], got 1.5.", nil},
		{"bad_words", `{"prompt":"hi","bad_words":["x","yz"]}`, false, "", "", func(r *Request) bool { return len(r.BadWords) == 2 }},
		{"bad_words empty string", `{"prompt":"hi","bad_words":["x",""]}`, false, "bad_words", "cannot contain an empty string", nil},
		{"bad_words type", `{"prompt":"hi","bad_words":"x"}`, false, "bad_words", "an array of strings", nil},
		{"chat defaults", `{` + msgs + `}`, true, "", "", func(r *Request) bool { return r.ParallelToolCalls && r.IncludeReasoning && !r.Echo }},
		{"parallel_tool_calls, include_reasoning", `{` + msgs + `,"parallel_tool_calls":false,"include_reasoning":false}`, true, "", "", func(r *Request) bool {
			return !r.ParallelToolCalls && !r.IncludeReasoning
		}},
		{"include_reasoning type", `{` + msgs + `,"include_reasoning":"no"}`, true, "include_reasoning", "a boolean", nil},
		{"chat echo", `{` + msgs + `,"echo":true}`, true, "", "", func(r *Request) bool { return r.Echo }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r, e := ParseRequest([]byte(tc.body), tc.chat)
			if tc.param == "" {
				if e != nil {
					t.Fatalf("refused: %v", e)
				}
				if !tc.check(r) {
					t.Fatalf("parsed %+v", r)
				}
				return
			}
			if e == nil || e.Param != tc.param || !strings.Contains(e.Message, tc.msg) || e.Status != 400 {
				t.Fatalf("got %+v, want 400 on %s with %q", e, tc.param, tc.msg)
			}
		})
	}
}

func TestContextErrorWording(t *testing.T) {
	e := ContextError("max_completion_tokens", 32000, 8192, 5000)
	want := "'max_tokens' or 'max_completion_tokens' is too large: 32000. This model's maximum context length is 8192 tokens and your request has 5000 input tokens (32000 > 8192 - 5000)."
	if e.Message != want || e.Status != 400 || e.Param != "max_completion_tokens" {
		t.Fatalf("%+v", e)
	}
}

// Repeats reads a tail as vLLM's check_sequence_repetition does.
func TestRepetitionDetection(t *testing.T) {
	for _, tc := range []struct {
		d    RepetitionDetection
		ids  []int
		want bool
	}{
		{RepetitionDetection{MaxPatternSize: 1, MinCount: 3}, []int{5, 7, 7, 7}, true},
		{RepetitionDetection{MaxPatternSize: 1, MinCount: 3}, []int{5, 7, 7}, false},
		{RepetitionDetection{MaxPatternSize: 3, MinCount: 2}, []int{1, 2, 3, 1, 2, 3}, true},
		{RepetitionDetection{MaxPatternSize: 3, MinCount: 2}, []int{1, 2, 3, 1, 2, 4}, false},
		{RepetitionDetection{MaxPatternSize: 3, MinCount: 3}, []int{9, 1, 2, 1, 2, 1, 2}, true},
		{RepetitionDetection{MaxPatternSize: 3, MinPatternSize: 3, MinCount: 2}, []int{1, 2, 1, 2}, false}, // patterns of 3 only
		{RepetitionDetection{MaxPatternSize: 4, MinPatternSize: 2, MinCount: 2}, []int{4, 4}, false},       // a run of 1 is below the minimum
		{RepetitionDetection{MaxPatternSize: 0, MinCount: 2}, []int{4, 4, 4}, false},
	} {
		if got := tc.d.Repeats(tc.ids); got != tc.want {
			t.Errorf("%+v on %v: %v, want %v", tc.d, tc.ids, got, tc.want)
		}
	}
}
