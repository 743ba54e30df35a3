package openai

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"slices"
	"strconv"
	"strings"
)

// Request is a /v1/completions or /v1/chat/completions body, checked and
// typed. Raw keeps every field as sent: the router forwards the body to
// vLLM's prefill with a few fields replaced, so fields this package does not
// model (chat_template_kwargs, guided decoding options...) reach vLLM
// unchanged.
type Request struct {
	Chat bool
	Raw  map[string]json.RawMessage

	Model     string
	Messages  []Message  // chat
	Prompt    PromptKind // completions: what the prompt is
	PromptIDs []int      // completions: the prompt when given as token ids
	// Prompts is a completions batch of more than one prompt, each a string
	// or token ids as sent; nil for one prompt.
	Prompts      []json.RawMessage
	Stream       bool
	IncludeUsage bool
	// ContinuousUsage puts the usage so far on every chunk
	// (stream_options.continuous_usage_stats, with include_usage).
	ContinuousUsage bool

	// MaxTokens counts generated tokens; 0 when the request sets none.
	MaxTokens      int
	MaxTokensParam string // the field MaxTokens came from

	Stop         []string
	StopTokenIDs []int
	IgnoreEOS    bool
	SkipSpecial  bool
	IncludeStop  bool

	Temperature *float64
	TopP        *float64
	TopK        *int
	Seed        *int64

	MinP *float64

	PresencePenalty   float64
	FrequencyPenalty  float64
	RepetitionPenalty float64 // 1: off
	MinTokens         int
	LogitBias         map[int]float64
	// BadWords must not be generated (vLLM's bad_words; the caller turns
	// them into token id sequences with its tokenizer).
	BadWords []string
	// ThinkingBudget caps a thinking block's tokens (thinking_token_budget;
	// nil: unset or -1, unlimited).
	ThinkingBudget *int
	// Repetition ends a generation whose tail repeats a pattern
	// (repetition_detection); nil: off.
	Repetition *RepetitionDetection

	// Logprobs asks for each emitted token's logprob; TopLogprobs for that
	// many alternatives (chat top_logprobs, completions logprobs=N).
	Logprobs    bool
	TopLogprobs int
	// TokensAsIDs writes logprob tokens as "token_id:N"
	// (return_tokens_as_token_ids).
	TokensAsIDs bool
	// ReturnTokenIDs adds the prompt's and the generated token ids to the
	// answer (return_token_ids).
	ReturnTokenIDs bool
	// PromptLogprobs asks for the prompt's logprobs with that many
	// alternatives (-1: the whole vocabulary), as vLLM's prefill computes
	// them; non-streamed answers only. nil: not asked.
	PromptLogprobs *int
	// ReturnPromptText adds the rendered prompt (chat, return_prompt_text).
	ReturnPromptText bool

	Tools      []Tool
	ToolChoice ToolChoice
	// ParallelToolCalls false keeps only the first tool call (chat).
	ParallelToolCalls bool
	// IncludeReasoning false leaves reasoning_content out of the answer
	// (chat; the reasoning is still generated).
	IncludeReasoning bool

	// ChatTemplateKwargs are passed to the chat template by vLLM; the
	// reasoning parsers read enable_thinking / thinking from them.
	ChatTemplateKwargs map[string]json.RawMessage

	N              int
	BestOf         int
	Echo           bool
	Suffix         string
	ResponseFormat string // "" or "text": plain; json_object, json_schema...

	// Unmodelled are the fields set that change vLLM's answer in ways this
	// package does not model (FieldOther), sorted: the caller refuses or
	// redirects such a request.
	Unmodelled []Unmodelled
}

// RepetitionDetection is vLLM's repetition_detection: a generation ends,
// finish_reason "repetition", once its last n tokens (MinPatternSize <= n
// <= MaxPatternSize) came MinCount times in a row.
type RepetitionDetection struct {
	MaxPatternSize int `json:"max_pattern_size"`
	MinPatternSize int `json:"min_pattern_size"`
	MinCount       int `json:"min_count"`
}

// Repeats reports whether ids end with a pattern repeated as d asks, as
// vLLM's check_sequence_repetition reads them.
func (d *RepetitionDetection) Repeats(ids []int) bool {
	lo := max(d.MinPatternSize, 1)
	if d.MaxPatternSize <= 0 || d.MinCount < 2 || lo > d.MaxPatternSize {
		return false
	}
	for n := lo; n <= d.MaxPatternSize; n++ {
		if n*d.MinCount > len(ids) {
			return false
		}
		tail := ids[len(ids)-n:]
		same := true
		for m := 1; m < d.MinCount && same; m++ {
			same = slices.Equal(ids[len(ids)-n*(m+1):len(ids)-n*m], tail)
		}
		if same {
			return true
		}
	}
	return false
}

// PromptKind says how a completions prompt was given.
type PromptKind int

// Prompt kinds.
const (
	PromptNone PromptKind = iota
	PromptText
	PromptIDs
)

// MaxLogprobs is vLLM's default --max-logprobs: the most alternatives a
// request may ask for.
const MaxLogprobs = 20

// fields decodes raw fields, treating JSON null as absent, and names the
// field in every error.
type fields map[string]json.RawMessage

// BadField is a 400 invalid_request_error naming param.
func BadField(param, format string, args ...any) *Error {
	return &Error{Status: http.StatusBadRequest, Type: "invalid_request_error", Param: param, Message: fmt.Sprintf(format, args...)}
}

func (f fields) get(name string, dst any) (bool, *Error) {
	v, ok := f[name]
	if !ok || isNull(v) {
		return false, nil
	}
	if err := json.Unmarshal(v, dst); err != nil {
		return true, BadField(name, "field %s: %s is not %s", name, Short(v), kindOf(dst))
	}
	return true, nil
}

func isNull(v json.RawMessage) bool { return bytes.Equal(bytes.TrimSpace(v), []byte("null")) }

// Short cuts b for an error message.
func Short(b []byte) string {
	if len(b) > 40 {
		return string(b[:40]) + "..."
	}
	return string(b)
}

func kindOf(dst any) string {
	switch dst.(type) {
	case *string:
		return "a string"
	case *bool:
		return "a boolean"
	case *int, *int64:
		return "an integer"
	case *float64:
		return "a number"
	case *[]int:
		return "an array of integers"
	case *[]string:
		return "an array of strings"
	case *map[string]json.RawMessage:
		return "an object"
	case *[]json.RawMessage:
		return "an array"
	case *[]Message:
		return "an array of messages"
	case *[]Tool:
		return "an array of tools ({\"type\":\"function\",\"function\":{\"name\":...}})"
	}
	return "of the expected type"
}

// ParseRequest reads and checks a body as vLLM's OpenAI server does: types
// and ranges of every field it models, with errors naming the field. What
// the serving pool can do with the request is the caller's decision.
func ParseRequest(body []byte, chat bool) (*Request, *Error) {
	var raw map[string]json.RawMessage
	if err := json.Unmarshal(body, &raw); err != nil || raw == nil {
		msg := "the body is not a JSON object"
		if err != nil {
			msg += ": " + err.Error()
		}
		return nil, &Error{Status: http.StatusBadRequest, Type: "invalid_request_error", Message: msg}
	}
	f := fields(raw)
	r := &Request{Chat: chat, Raw: raw, SkipSpecial: true, RepetitionPenalty: 1, N: 1, BestOf: 1,
		ParallelToolCalls: true, IncludeReasoning: true}
	steps := []func(fields) *Error{r.parseInput, r.parseLimits, r.parseSampling, r.parseLogprobs, r.parseTools}
	for _, s := range steps {
		if e := s(f); e != nil {
			return nil, e
		}
	}
	r.Unmodelled = unmodelled(f, chat)
	return r, nil
}

func (r *Request) parseInput(f fields) *Error {
	if _, e := f.get("model", &r.Model); e != nil {
		return e
	}
	if r.Chat {
		ok, e := f.get("messages", &r.Messages)
		if e != nil {
			return e
		}
		if !ok || len(r.Messages) == 0 {
			return BadField("messages", "field messages: missing or empty")
		}
		for i, m := range r.Messages {
			if m.Role == "" {
				return BadField("messages", "field messages[%d]: no role", i)
			}
		}
		if _, e := f.get("chat_template_kwargs", &r.ChatTemplateKwargs); e != nil {
			return e
		}
		for name, dst := range map[string]*bool{"parallel_tool_calls": &r.ParallelToolCalls, "include_reasoning": &r.IncludeReasoning} {
			if _, e := f.get(name, dst); e != nil {
				return e
			}
		}
	} else {
		if e := r.parsePrompt(f["prompt"]); e != nil {
			return e
		}
		if _, e := f.get("suffix", &r.Suffix); e != nil {
			return e
		}
		if ok, e := f.get("best_of", &r.BestOf); e != nil {
			return e
		} else if ok && r.BestOf < 1 {
			return BadField("best_of", "field best_of: %d must be at least 1", r.BestOf)
		}
	}
	if _, e := f.get("echo", &r.Echo); e != nil {
		return e
	}
	if ok, e := f.get("n", &r.N); e != nil {
		return e
	} else if ok && r.N < 1 {
		return BadField("n", "field n: %d must be at least 1", r.N)
	}
	var rf struct {
		Type string `json:"type"`
	}
	if v, ok := f["response_format"]; ok && !isNull(v) {
		if err := json.Unmarshal(v, &rf); err != nil {
			return BadField("response_format", "field response_format: want an object with a type")
		}
		r.ResponseFormat = rf.Type
	}
	return nil
}

// parsePrompt accepts one prompt (a string or an array of token ids) or a
// batch of them (an array of those), as vLLM's completions do.
func (r *Request) parsePrompt(v json.RawMessage) *Error {
	if v == nil || isNull(v) {
		return BadField("prompt", "field prompt: missing")
	}
	var s string
	if json.Unmarshal(v, &s) == nil {
		if s == "" {
			return BadField("prompt", "field prompt: empty")
		}
		r.Prompt = PromptText
		return nil
	}
	var ids []int
	if json.Unmarshal(v, &ids) == nil {
		if len(ids) == 0 {
			return BadField("prompt", "field prompt: empty")
		}
		r.Prompt, r.PromptIDs = PromptIDs, ids
		return nil
	}
	var list []json.RawMessage
	if json.Unmarshal(v, &list) == nil {
		if len(list) == 0 {
			return BadField("prompt", "field prompt: empty")
		}
		for i, p := range list {
			var one Request
			var nested []json.RawMessage
			if json.Unmarshal(p, &nested) == nil && len(nested) > 0 && json.Unmarshal(nested[0], new([]json.RawMessage)) == nil {
				return BadField("prompt", "field prompt[%d]: a batch holds strings or arrays of token ids, not deeper arrays", i)
			}
			if e := one.parsePrompt(p); e != nil {
				e.Message = strings.Replace(e.Message, "field prompt:", fmt.Sprintf("field prompt[%d]:", i), 1)
				return e
			}
			if i == 0 {
				r.Prompt, r.PromptIDs = one.Prompt, one.PromptIDs
			}
		}
		if len(list) > 1 {
			r.Prompts = list
		}
		return nil
	}
	return BadField("prompt", "field prompt: want a string, an array of token ids, or an array with one of those")
}

func (r *Request) parseLimits(f fields) *Error {
	if _, e := f.get("stream", &r.Stream); e != nil {
		return e
	}
	var so map[string]json.RawMessage
	if ok, e := f.get("stream_options", &so); e != nil {
		return e
	} else if ok {
		if !r.Stream {
			return BadField("stream_options", "field stream_options: only allowed with stream true")
		}
		for name, dst := range map[string]*bool{"include_usage": &r.IncludeUsage, "continuous_usage_stats": &r.ContinuousUsage} {
			if _, e := fields(so).get(name, dst); e != nil {
				e.Param, e.Message = "stream_options."+name, "field stream_options."+e.Message[len("field "):]
				return e
			}
		}
		r.ContinuousUsage = r.ContinuousUsage && r.IncludeUsage // vLLM's rule
	}
	names := []string{"max_tokens"}
	if r.Chat {
		names = []string{"max_completion_tokens", "max_tokens"} // the newer name wins, as in OpenAI's API
	}
	for _, name := range names {
		var v float64
		ok, e := f.get(name, &v)
		if e != nil {
			return e
		}
		if !ok {
			continue
		}
		if v != math.Trunc(v) || v < 1 || v > math.MaxInt32 {
			return BadField(name, "field %s: %v must be a whole number >= 1 (max_tokens must be at least 1)", name, v)
		}
		r.MaxTokens, r.MaxTokensParam = int(v), name
		break
	}
	if r.MaxTokens == 0 && !r.Chat {
		r.MaxTokens, r.MaxTokensParam = 16, "max_tokens" // OpenAI's (and vLLM's) completions default
	}
	if v, ok := f["stop"]; ok && !isNull(v) {
		var one string
		if json.Unmarshal(v, &one) == nil {
			r.Stop = []string{one}
		} else if json.Unmarshal(v, &r.Stop) != nil {
			return BadField("stop", "field stop: want a string or an array of strings")
		}
		kept := r.Stop[:0]
		for _, s := range r.Stop {
			if s != "" {
				kept = append(kept, s)
			}
		}
		r.Stop = kept
	}
	for name, dst := range map[string]any{"stop_token_ids": &r.StopTokenIDs, "ignore_eos": &r.IgnoreEOS,
		"skip_special_tokens": &r.SkipSpecial, "include_stop_str_in_output": &r.IncludeStop} {
		if _, e := f.get(name, dst); e != nil {
			return e
		}
	}
	if ok, e := f.get("min_tokens", &r.MinTokens); e != nil {
		return e
	} else if ok && r.MinTokens < 0 {
		return BadField("min_tokens", "field min_tokens: min_tokens must be greater than or equal to 0, got %d", r.MinTokens)
	}
	if r.MaxTokens > 0 && r.MinTokens > r.MaxTokens {
		return BadField("min_tokens", "field min_tokens: min_tokens must be less than or equal to max_tokens=%d, got %d", r.MaxTokens, r.MinTokens)
	}
	return nil
}

// parseSampling checks the sampling fields against vLLM's SamplingParams
// ranges, in its words.
func (r *Request) parseSampling(f fields) *Error {
	var t, p float64
	var k int
	var seed int64
	if ok, e := f.get("temperature", &t); e != nil {
		return e
	} else if ok {
		if t < 0 || math.IsNaN(t) {
			return BadField("temperature", "field temperature: temperature must be non-negative, got %g", t)
		}
		r.Temperature = &t
	}
	if ok, e := f.get("top_p", &p); e != nil {
		return e
	} else if ok {
		if !(p > 0 && p <= 1) {
			return BadField("top_p", "field top_p: top_p must be in (0, 1], got %g", p)
		}
		r.TopP = &p
	}
	if ok, e := f.get("top_k", &k); e != nil {
		return e
	} else if ok {
		if k < -1 {
			return BadField("top_k", "field top_k: top_k must be 0 or -1 (disable), or at least 1, got %d", k)
		}
		r.TopK = &k
	}
	var mp float64
	if ok, e := f.get("min_p", &mp); e != nil {
		return e
	} else if ok {
		if !(mp >= 0 && mp <= 1) {
			return BadField("min_p", "field min_p: min_p must be in [0, 1], got %g.", mp)
		}
		r.MinP = &mp
	}
	var tb float64
	if ok, e := f.get("thinking_token_budget", &tb); e != nil || (ok && (tb != math.Trunc(tb) || tb < -1 || tb > math.MaxInt32)) {
		return BadField("thinking_token_budget", "field thinking_token_budget: `thinking_token_budget` must be a non-negative integer or -1 for unlimited.")
	} else if ok && tb >= 0 {
		b := int(tb)
		r.ThinkingBudget = &b
	}
	var rd RepetitionDetection
	if ok, e := f.get("repetition_detection", &rd); e != nil {
		return BadField("repetition_detection", "field repetition_detection: want {\"max_pattern_size\", \"min_pattern_size\", \"min_count\"} as integers")
	} else if ok {
		if rd.MaxPatternSize < 0 || rd.MinPatternSize < 0 || rd.MinPatternSize > rd.MaxPatternSize {
			return BadField("repetition_detection", "field repetition_detection: max_pattern_size, min_pattern_size must be >=0, with min_pattern_size <= max_pattern_size. Set both to 0 to disable repetitive pattern detection.")
		}
		if rd.MaxPatternSize > 0 && rd.MinCount < 2 {
			return BadField("repetition_detection", "field repetition_detection: min_count must be >= 2 to detect repetitive patterns in engine output. If you do not wish to detect repetitive patterns, set max_pattern_size to 0.")
		}
		if rd.MaxPatternSize > 0 {
			r.Repetition = &rd
		}
	}
	if _, e := f.get("bad_words", &r.BadWords); e != nil {
		return e
	}
	for _, w := range r.BadWords {
		if w == "" {
			return BadField("bad_words", "field bad_words: bad_words cannot contain an empty string. Got bad_words=%q", r.BadWords)
		}
	}
	if ok, e := f.get("seed", &seed); e != nil {
		return e
	} else if ok {
		r.Seed = &seed
	}
	for _, pp := range []struct {
		name string
		dst  *float64
	}{{"presence_penalty", &r.PresencePenalty}, {"frequency_penalty", &r.FrequencyPenalty}} {
		if ok, e := f.get(pp.name, pp.dst); e != nil {
			return e
		} else if ok && !(*pp.dst >= -2 && *pp.dst <= 2) {
			return BadField(pp.name, "field %s: %s must be in [-2, 2], got %g", pp.name, pp.name, *pp.dst)
		}
	}
	if ok, e := f.get("repetition_penalty", &r.RepetitionPenalty); e != nil {
		return e
	} else if ok && !(r.RepetitionPenalty > 0) {
		return BadField("repetition_penalty", "field repetition_penalty: repetition_penalty must be greater than zero, got %g", r.RepetitionPenalty)
	}
	var lb map[string]float64
	if ok, e := f.get("logit_bias", &lb); e != nil {
		return BadField("logit_bias", "field logit_bias: want an object mapping token ids (as strings) to numbers")
	} else if ok && len(lb) > 0 {
		r.LogitBias = make(map[int]float64, len(lb))
		for key, v := range lb {
			id, err := strconv.Atoi(key)
			if err != nil || id < 0 {
				return BadField("logit_bias", "field logit_bias: key %q is not a token id", key)
			}
			// vLLM clamps biases to [-100, 100].
			r.LogitBias[id] = min(100, max(-100, v))
		}
	}
	return nil
}

func (r *Request) parseLogprobs(f fields) *Error {
	if _, e := f.get("return_tokens_as_token_ids", &r.TokensAsIDs); e != nil {
		return e
	}
	if _, e := f.get("return_token_ids", &r.ReturnTokenIDs); e != nil {
		return e
	}
	if r.Chat {
		if _, e := f.get("return_prompt_text", &r.ReturnPromptText); e != nil {
			return e
		}
	}
	var pl int
	if ok, e := f.get("prompt_logprobs", &pl); e != nil {
		return e
	} else if ok {
		switch {
		case pl < -1:
			return BadField("prompt_logprobs", "field prompt_logprobs: `prompt_logprobs` must be a positive value or -1.")
		case r.Stream && pl != 0:
			return BadField("prompt_logprobs", "field prompt_logprobs: `prompt_logprobs` are not available when `stream=True`.")
		case pl > MaxLogprobs:
			return BadField("prompt_logprobs", "field prompt_logprobs: Requested prompt logprobs of %d, which is greater than max allowed: %d", pl, MaxLogprobs)
		}
		r.PromptLogprobs = &pl
	}
	if r.Chat {
		if _, e := f.get("logprobs", &r.Logprobs); e != nil {
			return e
		}
		ok, e := f.get("top_logprobs", &r.TopLogprobs)
		if e != nil {
			return e
		}
		if ok && r.TopLogprobs < 0 {
			return BadField("top_logprobs", "field top_logprobs: `top_logprobs` must be a positive value, got %d", r.TopLogprobs)
		}
		if r.TopLogprobs > 0 && !r.Logprobs {
			return BadField("top_logprobs", "field top_logprobs: when using `top_logprobs`, `logprobs` must be set to true")
		}
	} else {
		var n int
		ok, e := f.get("logprobs", &n)
		if e != nil {
			return e
		}
		if ok {
			if n < 0 {
				return BadField("logprobs", "field logprobs: logprobs must be non-negative, got %d", n)
			}
			r.Logprobs, r.TopLogprobs = true, n
		}
	}
	if r.TopLogprobs > MaxLogprobs {
		param := "logprobs"
		if r.Chat {
			param = "top_logprobs"
		}
		return BadField(param, "field %s: Requested sample logprobs of %d, which is greater than max allowed: %d", param, r.TopLogprobs, MaxLogprobs)
	}
	return nil
}

func (r *Request) parseTools(f fields) *Error {
	if !r.Chat {
		return nil
	}
	if _, e := f.get("tools", &r.Tools); e != nil {
		return e
	}
	for i, t := range r.Tools {
		if t.Type != "function" || t.Function.Name == "" {
			return BadField("tools", "field tools[%d]: want {\"type\":\"function\",\"function\":{\"name\":...}}", i)
		}
	}
	if _, ok := f["functions"]; ok {
		return BadField("functions", "field functions: the deprecated functions field is not supported; send tools")
	}
	r.ToolChoice = ToolChoice{Mode: ToolChoiceNone}
	if len(r.Tools) > 0 {
		r.ToolChoice.Mode = ToolChoiceAuto
	}
	v, ok := f["tool_choice"]
	if !ok || isNull(v) {
		return nil
	}
	var s string
	if json.Unmarshal(v, &s) == nil {
		switch s {
		case ToolChoiceNone, ToolChoiceAuto, ToolChoiceRequired:
			r.ToolChoice.Mode = s
		default:
			return BadField("tool_choice", "field tool_choice: %q is not none, auto, required or a named function", s)
		}
	} else {
		var named struct {
			Type     string `json:"type"`
			Function struct {
				Name string `json:"name"`
			} `json:"function"`
		}
		if err := json.Unmarshal(v, &named); err != nil || named.Function.Name == "" {
			return BadField("tool_choice", "field tool_choice: want \"none\", \"auto\", \"required\" or {\"type\":\"function\",\"function\":{\"name\":...}}")
		}
		r.ToolChoice = ToolChoice{Mode: ToolChoiceNamed, Name: named.Function.Name}
	}
	if r.ToolChoice.Mode != ToolChoiceNone && len(r.Tools) == 0 {
		return BadField("tool_choice", "field tool_choice: %q needs tools", r.ToolChoice.Mode)
	}
	if r.ToolChoice.Mode == ToolChoiceNamed && r.FindTool(r.ToolChoice.Name) == nil {
		return BadField("tool_choice", "field tool_choice: function %q is not among the tools", r.ToolChoice.Name)
	}
	return nil
}

// FindTool returns the tool named name, or nil.
func (r *Request) FindTool(name string) *Tool {
	for i := range r.Tools {
		if r.Tools[i].Function.Name == name {
			return &r.Tools[i]
		}
	}
	return nil
}

// Thinking reads chat_template_kwargs[key] as a boolean; def when absent.
func (r *Request) Thinking(key string, def bool) bool {
	v, ok := r.ChatTemplateKwargs[key]
	if !ok {
		return def
	}
	var b bool
	if json.Unmarshal(v, &b) != nil {
		return def
	}
	return b
}

// ContextError is vLLM's 400 for max_tokens that cannot fit the context.
func ContextError(param string, maxTokens, maxLen, promptTokens int) *Error {
	if param == "" {
		param = "max_tokens"
	}
	return &Error{Status: http.StatusBadRequest, Type: "BadRequestError", Param: param,
		Message: fmt.Sprintf("'max_tokens' or 'max_completion_tokens' is too large: %d. This model's maximum context length is %d tokens and your request has %d input tokens (%d > %d - %d).",
			maxTokens, maxLen, promptTokens, maxTokens, maxLen, promptTokens)}
}

// PromptTooLongError is vLLM's 400 for a prompt that leaves no room.
func PromptTooLongError(maxLen, promptTokens int) *Error {
	return &Error{Status: http.StatusBadRequest, Type: "BadRequestError",
		Message: fmt.Sprintf("This model's maximum context length is %d tokens. However, your request has %d input tokens. Please reduce the length of the input messages.", maxLen, promptTokens)}
}
