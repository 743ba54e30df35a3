// Package parsers turns a chat model's decoded text into OpenAI's parts:
// reasoning_content (text inside the model's thinking block), content, and
// tool_calls parsed from the model's native tool-call markup. Parsers are
// streaming: text goes in piece by piece as it is decoded, and every piece
// of output is final once returned, so a streamed answer is the
// concatenation of its deltas and equals the non-streamed one (which is the
// same parser fed the same text).
//
// Formats (from the models' chat templates and vLLM's parsers of the same
// names):
//
//	glm45, glm47   <tool_call>NAME<arg_key>K</arg_key><arg_value>V</arg_value>...</tool_call>
//	               (glm45 puts newlines between the parts; both are accepted)
//	deepseek_v32   <｜DSML｜function_calls><｜DSML｜invoke name="NAME"><｜DSML｜parameter
//	               name="K" string="true|false">V</｜DSML｜parameter>...</｜DSML｜invoke>...
//	               </｜DSML｜function_calls>
//	reasoning      text up to </think> (a leading <think> dropped) is reasoning
package parsers

import (
	"strings"

	"github.com/cockroachdb/errors"
)

// Reasoning parser names, as vLLM's --reasoning-parser.
var ReasoningParsers = []string{"glm45", "deepseek_v3", "deepseek_r1"}

// Tool parser names, as vLLM's --tool-call-parser.
var ToolParsers = []string{"glm45", "glm47", "deepseek_v32"}

// CheckReasoningParser says whether name is known ("" is: no parser).
func CheckReasoningParser(name string) error {
	return check("reasoning", name, ReasoningParsers)
}

// CheckToolParser says whether name is known ("" is: no parser).
func CheckToolParser(name string) error {
	return check("tool-call", name, ToolParsers)
}

func check(kind, name string, known []string) error {
	if name == "" {
		return nil
	}
	for _, k := range known {
		if k == name {
			return nil
		}
	}
	return errors.WithHintf(errors.Newf("unknown %s parser %q", kind, name), "use one of %s", strings.Join(known, ", "))
}

const (
	thinkStart = "<think>"
	thinkEnd   = "</think>"
)

// ReasoningTags are the texts that open and close a thinking block for the
// reasoning parsers here (vLLM's reasoning_start_str / reasoning_end_str:
// the same for glm45, deepseek_v3 and deepseek_r1).
func ReasoningTags() (start, end string) { return thinkStart, thinkEnd }

// Reasoning splits text into reasoning and content.
type Reasoning struct {
	on      bool // inside the thinking block
	started bool // some text seen (a leading <think> is only dropped at the start)
	held    string
}

// NewReasoning returns a splitter for parser name. thinking says whether
// the prompt left the model inside its thinking block (the router sets it
// from chat_template_kwargs: enable_thinking or, for DeepSeek-V3.x,
// thinking); deepseek_r1 always thinks. A model that opens with <think>
// itself is inside it either way (GLM-4.5 does, as vLLM's glm45 parser
// expects).
func NewReasoning(name string, thinking bool) *Reasoning {
	if name == "deepseek_r1" {
		thinking = true
	}
	return &Reasoning{on: thinking}
}

// Add consumes a piece of decoded text and returns what is now known to be
// reasoning and content.
func (r *Reasoning) Add(piece string) (reasoning, content string) {
	s := r.held + piece
	r.held = ""
	if !r.started {
		// A leading <think> opens the block (GLM-4.5 writes it itself).
		if strings.HasPrefix(s, thinkStart) {
			s, r.on, r.started = s[len(thinkStart):], true, true
		} else if strings.HasPrefix(thinkStart, s) {
			r.held = s
			return "", ""
		} else {
			r.started = true
		}
	}
	if !r.on {
		return "", s
	}
	if i := strings.Index(s, thinkEnd); i >= 0 {
		r.on = false
		return s[:i], s[i+len(thinkEnd):]
	}
	keep := partialSuffix(s, thinkEnd)
	r.held = s[len(s)-keep:]
	return s[:len(s)-keep], ""
}

// Finish returns what is still held: the text ended, so a partial tag is
// plain text.
func (r *Reasoning) Finish() (reasoning, content string) {
	s := r.held
	r.held = ""
	if r.on {
		return s, ""
	}
	return "", s
}

// partialSuffix is the length of the longest suffix of s that is a proper
// prefix of tag (text that may still become tag).
func partialSuffix(s, tag string) int {
	for k := min(len(tag)-1, len(s)); k > 0; k-- {
		if strings.HasSuffix(s, tag[:k]) {
			return k
		}
	}
	return 0
}

// ReasoningCounter counts the generated tokens inside thinking blocks for
// usage.completion_tokens_details.reasoning_tokens, by vLLM's rule (its
// thinking parsers' count_reasoning_tokens): the tokens strictly between a
// start id and its end id, nested blocks by depth, a stray end id ignored.
// deepseek_v3 without thinking is vLLM's identity parser there: 0. The
// rule reads the generated ids only, so a block the prompt opened counts
// only from a <think> the model writes itself, as vLLM counts it.
type ReasoningCounter struct {
	start, end int
	off        bool
	depth, n   int
}

// NewReasoningCounter returns the counter for parser name with the tags'
// ids (single tokens: vLLM's start_token_id / end_token_id; -1 when the
// vocabulary has none, which counts nothing).
func NewReasoningCounter(name string, thinking bool, start, end int) *ReasoningCounter {
	return &ReasoningCounter{start: start, end: end, off: (name == "deepseek_v3" && !thinking) || start < 0 || end < 0}
}

// Add consumes one generated id.
func (c *ReasoningCounter) Add(id int) {
	switch {
	case c.off:
	case id == c.start:
		c.depth++
	case id == c.end:
		if c.depth > 0 {
			c.depth--
		}
	case c.depth > 0:
		c.n++
	}
}

// Tokens is the count so far.
func (c *ReasoningCounter) Tokens() int { return c.n }
