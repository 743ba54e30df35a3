package router

import (
	"bufio"
	"encoding/json"
	"math"
	"slices"
	"strconv"
	"strings"
	"sync"
	"unicode/utf8"

	"github.com/tilert-go/tilert/api/decodeapi"
	"github.com/tilert-go/tilert/openai"
	"github.com/tilert-go/tilert/openai/parsers"
	"github.com/tilert-go/tilert/tokenizer"
)

// pipeline carries each generated token to the client: detokenised and cut
// at stop strings (textStream), split into reasoning and content (the
// reasoning parser), content split into text and tool calls (the tool
// parser), each piece emitted as soon as it is final. Streamed and
// non-streamed answers run the same pipeline and differ only in the
// emitter, so their content is equal.
type pipeline struct {
	tok  *tokenizer.Tokenizer
	ts   *textStream
	rs   *parsers.Reasoning
	tp   *parsers.Tools
	em   emitter
	lp   bool // logprobs asked for
	chat bool
	// hideReasoning drops the reasoning (include_reasoning false); vLLM
	// then drops the logprobs too, which would spell the reasoning out.
	hideReasoning bool
	firstCallOnly bool // parallel_tool_calls false: only tool call 0
	asIDs         bool // return_tokens_as_token_ids: logprob tokens as token_id:N
	// repetition_detection: the generated ids (the first included) and
	// whether their tail repeated, which ends the generation ("repetition").
	rep                  *openai.RepetitionDetection
	minTokens, maxTokens int
	gen                  []int
	repeated             bool
}

func newPipeline(tok *tokenizer.Tokenizer, r *genRequest, em emitter) *pipeline {
	p := &pipeline{tok: tok, ts: newTextStream(tok, r), em: em, lp: r.Logprobs, chat: r.Chat}
	if r.reasoning != "" {
		p.rs = parsers.NewReasoning(r.reasoning, r.thinking)
		if !r.IncludeReasoning {
			// vLLM drops the token ids too, for the same reason.
			p.hideReasoning, p.lp = true, false
		}
	}
	p.rep, p.minTokens, p.maxTokens = r.Repetition, r.MinTokens, r.MaxTokens
	p.firstCallOnly = !r.ParallelToolCalls
	p.asIDs = r.TokensAsIDs
	if r.toolParser != "" {
		p.tp = parsers.NewTools(r.toolParser, r.Tools, r.ToolChoice.Name, newToolCallID)
	}
	return p
}

// token consumes one generated id; lp is its logprob line entry (nil when
// not asked for).
func (p *pipeline) token(id int, lp *decodeapi.TokenLogprob) {
	if p.ts.stopped {
		return
	}
	if p.lp && lp != nil {
		p.em.logprob(p.tokenLogprob(id, lp))
	}
	p.em.tokenID(id)
	p.text(p.ts.add(id))
	if p.rep != nil && !p.ts.stopped {
		// As vLLM's check_stop: after the token, never before min_tokens,
		// and a stop id or the last token allowed ends it as stop / length.
		p.gen = append(p.gen, id)
		last := slices.Contains(p.ts.stopIDs, id) || (p.maxTokens > 0 && len(p.gen) >= p.maxTokens)
		if !last && len(p.gen) >= p.minTokens && p.rep.Repeats(p.gen) {
			p.repeated = true
			p.text(p.ts.end())
		}
	}
}

// stopReason is the finish reason of a generation the pipeline ended: a
// stop string, or a repeated pattern.
func (p *pipeline) stopReason() string {
	if p.repeated {
		return "repetition"
	}
	return "stop"
}

func (p *pipeline) text(s string) {
	if s == "" {
		return
	}
	content := s
	if p.rs != nil {
		var r string
		r, content = p.rs.Add(s)
		p.reasoning(r)
	}
	p.content(content)
}

func (p *pipeline) reasoning(s string) {
	if !p.hideReasoning {
		p.em.reasoning(s)
	}
}

// tools emits tool-call deltas, only the first call's when parallel tool
// calls are off (as vLLM: later calls are parsed and dropped).
func (p *pipeline) tools(ds []openai.ToolCallDelta) {
	if p.firstCallOnly {
		kept := ds[:0:0]
		for _, d := range ds {
			if d.Index == 0 {
				kept = append(kept, d)
			}
		}
		ds = kept
	}
	p.em.tools(ds)
}

func (p *pipeline) content(s string) {
	if p.tp == nil {
		p.em.content(s)
		return
	}
	c, ds := p.tp.Add(s)
	p.em.content(c)
	p.tools(ds)
}

// end flushes everything held and returns the tool calls parsed.
func (p *pipeline) end() []openai.ToolCall {
	p.text(p.ts.finish())
	if p.rs != nil {
		r, c := p.rs.Finish()
		p.reasoning(r)
		p.content(c)
	}
	if p.tp != nil {
		c, ds := p.tp.Finish()
		p.em.content(c)
		p.tools(ds)
		calls := p.tp.Calls()
		if p.firstCallOnly && len(calls) > 1 {
			calls = calls[:1]
		}
		return calls
	}
	return nil
}

// tokenLogprob is one token's logprob entry in OpenAI's chat shape (the
// completions shape is built from it). -inf is written as vLLM does.
func (p *pipeline) tokenLogprob(id int, lp *decodeapi.TokenLogprob) openai.TokenLogprob {
	t := openai.TokenLogprob{Token: p.tokenText(id), Logprob: finiteLogprob(lp.P), Bytes: byteInts(p.tok.TokenBytes(id)),
		TopLogprobs: make([]openai.TopLogprob, 0, len(lp.Top))}
	for _, a := range lp.Top {
		ta := openai.TopLogprob{Token: p.tokenText(a.ID), Logprob: finiteLogprob(a.P), Bytes: byteInts(p.tok.TokenBytes(a.ID))}
		if p.asIDs {
			ta.Bytes = byteInts([]byte(ta.Token)) // vLLM: the alternatives' bytes are the placeholder's
		}
		t.TopLogprobs = append(t.TopLogprobs, ta)
	}
	return t
}

func (p *pipeline) tokenText(id int) string {
	if p.asIDs {
		return "token_id:" + strconv.Itoa(id)
	}
	return p.tok.Decode([]int{id}, false)
}

func finiteLogprob(v float64) float64 {
	if math.IsInf(v, -1) || math.IsNaN(v) {
		return -9999.0
	}
	return v
}

func byteInts(b []byte) []int {
	out := make([]int, len(b))
	for i, c := range b {
		out[i] = int(c)
	}
	return out
}

// emitter writes a generation to the client: SSE chunks or one JSON body.
type emitter interface {
	start()
	reasoning(s string)
	content(s string)
	tools(ds []openai.ToolCallDelta)
	logprob(lp openai.TokenLogprob) // belongs to the next piece emitted
	tokenID(id int)                 // every generated id (return_token_ids, continuous usage): as a logprob
	usageOf(prompt, completion int) openai.Usage
	finish(reason string, u openai.Usage, calls []openai.ToolCall)
	fail(e *openai.Error) // after start: the stream ends with an error
}

type base struct {
	chat       bool
	id         string
	model      string
	created    int64
	reasoningP bool // a reasoning parser runs: reasoning_content is reported
	lps        []openai.TokenLogprob
	textLen    int // completions text_offset
	// return_token_ids: the prompt's ids (sent once: a stream's first
	// chunk) and the generated ids not yet sent.
	wantIDs   bool
	promptIDs []int
	ids       []int
	// stream_options.continuous_usage_stats: the usage so far on every
	// chunk, the prompt's tokens and the ids generated.
	continuous   bool
	promptTokens int
	generated    int
	// think counts the reasoning tokens (chat with a reasoning parser).
	think *parsers.ReasoningCounter
	// vLLM's prompt_logprobs (non-streamed answers) and rendered prompt
	// (a stream's first chunk), relayed when asked for.
	promptLogprobs json.RawMessage
	promptText     *string
	index          int // the choice's index (n > 1)
}

// takePromptText returns the rendered prompt the first time, then nil.
func (b *base) takePromptText() *string {
	t := b.promptText
	b.promptText = nil
	return t
}

func (b *base) tokenID(id int) {
	b.generated++
	if b.think != nil {
		b.think.Add(id)
	}
	if b.wantIDs {
		b.ids = append(b.ids, id)
	}
}

// usageSoFar is a chunk's usage with continuous_usage_stats, else nil.
func (b *base) usageSoFar() *openai.Usage {
	if !b.continuous {
		return nil
	}
	u := b.usageOf(b.promptTokens, b.generated)
	return &u
}

// usageOf is the usage of prompt and completion tokens, with the reasoning
// tokens where a reasoning parser runs.
func (b *base) usageOf(prompt, completion int) openai.Usage {
	u := openai.NewUsage(prompt, completion)
	if b.think != nil {
		u.CompletionTokensDetails = &openai.CompletionTokensDetails{ReasoningTokens: b.think.Tokens()}
	}
	return u
}

// takeIDs returns the prompt's ids the first time and the ids not yet sent
// (nil, nil without return_token_ids).
func (b *base) takeIDs() (prompt, ids []int) {
	if !b.wantIDs {
		return nil, nil
	}
	prompt, ids = b.promptIDs, b.ids
	b.promptIDs, b.ids = nil, nil
	return prompt, ids
}

func newBase(r *genRequest, model, rid string, created int64) base {
	// With include_reasoning false vLLM leaves the token ids out too: they
	// would spell the reasoning out.
	hidden := r.reasoning != "" && !r.IncludeReasoning
	b := base{chat: r.Chat, model: model, created: created, reasoningP: r.reasoning != "", wantIDs: r.ReturnTokenIDs && !hidden,
		continuous: r.Stream && r.ContinuousUsage}
	if r.Chat && r.reasoning != "" {
		b.think = parsers.NewReasoningCounter(r.reasoning, r.thinking, r.thinkIDs[0], r.thinkIDs[1])
	}
	if r.Chat {
		b.id = "chatcmpl-" + rid
	} else {
		b.id = "cmpl-" + rid
	}
	return b
}

// completionLogprobs turns entries into the legacy completions shape; the
// sampled token joins the top alternatives when it is not among them.
func (b *base) completionLogprobs(lps []openai.TokenLogprob) *openai.CompletionLogprobs {
	out := &openai.CompletionLogprobs{Tokens: []string{}, TokenLogprobs: []float64{}, TopLogprobs: []map[string]float64{}, TextOffset: []int{}}
	off := b.textLen
	for _, lp := range lps {
		out.Tokens = append(out.Tokens, lp.Token)
		out.TokenLogprobs = append(out.TokenLogprobs, lp.Logprob)
		top := make(map[string]float64, len(lp.TopLogprobs)+1)
		for _, a := range lp.TopLogprobs {
			top[a.Token] = a.Logprob
		}
		top[lp.Token] = lp.Logprob
		out.TopLogprobs = append(out.TopLogprobs, top)
		out.TextOffset = append(out.TextOffset, off)
		off += utf8.RuneCountInString(lp.Token) // vLLM counts characters (Python's len)
	}
	b.textLen = off
	return out
}

// jsonEmitter collects the answer for one JSON body.
type jsonEmitter struct {
	base
	sb, rsb strings.Builder
	resp    any    // the answer (openai.ChatCompletion or openai.Completion), once finished
	body    []byte // resp as JSON
	err     *openai.Error
	usage   openai.Usage // at finish
}

func (e *jsonEmitter) start()                         {}
func (e *jsonEmitter) reasoning(s string)             { e.rsb.WriteString(s) }
func (e *jsonEmitter) content(s string)               { e.sb.WriteString(s) }
func (e *jsonEmitter) tools([]openai.ToolCallDelta)   {}
func (e *jsonEmitter) logprob(lp openai.TokenLogprob) { e.lps = append(e.lps, lp) }
func (e *jsonEmitter) fail(a *openai.Error)           { e.err = a }

func (e *jsonEmitter) finish(reason string, u openai.Usage, calls []openai.ToolCall) {
	e.usage = u
	var v any
	if e.chat {
		msg := openai.ResponseMessage{Role: "assistant", ToolCalls: calls}
		if msg.ToolCalls == nil {
			msg.ToolCalls = []openai.ToolCall{}
		}
		// Empty content beside tool calls or reasoning is null, as vLLM's.
		if c := e.sb.String(); c != "" || (len(calls) == 0 && e.rsb.Len() == 0) {
			msg.Content = &c
		}
		if r := e.rsb.String(); e.reasoningP && r != "" {
			msg.ReasoningContent = &r
		}
		ch := openai.ChatChoice{Index: e.index, Message: msg, FinishReason: reason}
		if e.lps != nil {
			ch.Logprobs = &openai.ChatLogprobs{Content: e.lps}
		}
		prompt, ids := e.takeIDs()
		ch.TokenIDs = ids
		v = openai.ChatCompletion{ID: e.id, Object: openai.ObjectChat, Created: e.created, Model: e.model,
			Choices: []openai.ChatChoice{ch}, Usage: &u, PromptTokenIDs: prompt, PromptLogprobs: e.promptLogprobs,
			PromptText: e.takePromptText()}
	} else {
		ch := openai.CompletionChoice{Index: e.index, Text: e.sb.String(), FinishReason: &reason}
		if e.lps != nil {
			ch.Logprobs = e.completionLogprobs(e.lps)
		}
		ch.PromptTokenIDs, ch.TokenIDs = e.takeIDs()
		ch.PromptLogprobs = e.promptLogprobs
		v = openai.Completion{ID: e.id, Object: openai.ObjectCompletion, Created: e.created, Model: e.model,
			Choices: []openai.CompletionChoice{ch}, Usage: &u}
	}
	e.resp = v
	e.body, _ = json.Marshal(v)
	e.body = append(e.body, '\n')
}

// mergeJSON is one answer of every choice from the finished emitters of a
// request's generations, in index order, with the request's usage u.
func mergeJSON(ems []*jsonEmitter, u openai.Usage) []byte {
	var v any
	switch first := ems[0].resp.(type) {
	case openai.ChatCompletion:
		for _, e := range ems[1:] {
			first.Choices = append(first.Choices, e.resp.(openai.ChatCompletion).Choices...)
		}
		first.Usage = &u
		v = first
	case openai.Completion:
		for _, e := range ems[1:] {
			first.Choices = append(first.Choices, e.resp.(openai.Completion).Choices...)
		}
		first.Usage = &u
		v = first
	}
	b, _ := json.Marshal(v)
	return append(b, '\n')
}

// sseEmitter writes SSE chunks to w, flushing each; a failed flush means
// the client is gone (gone is called once).
type sseEmitter struct {
	base
	w            *bufio.Writer
	includeUsage bool
	gone         func()
	broken       bool
	toolsSeen    bool
	// One of n generations sharing w (n > 1): lock guards w, and the
	// request's end (usage, [DONE]) is written once, by its caller.
	lock  *sync.Mutex
	multi bool
	usage openai.Usage // at finish
}

func (e *sseEmitter) event(v any) {
	if e.lock != nil {
		e.lock.Lock()
		defer e.lock.Unlock()
	}
	if e.broken {
		return
	}
	b, _ := json.Marshal(v)
	_, _ = e.w.WriteString("data: ")
	_, _ = e.w.Write(b)
	_, _ = e.w.WriteString("\n\n")
	if e.w.Flush() != nil {
		e.broken = true
		e.gone()
	}
}

func (e *sseEmitter) chatChunk(d openai.Delta, finish *string) {
	ch := openai.ChunkChoice{Index: e.index, Delta: d, FinishReason: finish}
	if e.lps != nil {
		ch.Logprobs = &openai.ChatLogprobs{Content: e.lps}
		e.lps = nil
	}
	prompt, ids := e.takeIDs()
	ch.TokenIDs = ids
	e.event(openai.ChatCompletionChunk{ID: e.id, Object: openai.ObjectChatChunk, Created: e.created, Model: e.model,
		Choices: []openai.ChunkChoice{ch}, PromptTokenIDs: prompt, PromptText: e.takePromptText(), Usage: e.usageSoFar()})
}

func (e *sseEmitter) textChunk(s string, finish *string) {
	ch := openai.CompletionChoice{Index: e.index, Text: s, FinishReason: finish}
	if e.lps != nil {
		ch.Logprobs = e.completionLogprobs(e.lps)
		e.lps = nil
	}
	ch.PromptTokenIDs, ch.TokenIDs = e.takeIDs()
	e.event(openai.Completion{ID: e.id, Object: openai.ObjectCompletion, Created: e.created, Model: e.model,
		Choices: []openai.CompletionChoice{ch}, Usage: e.usageSoFar()})
}

func (e *sseEmitter) start() {
	if e.chat {
		empty := ""
		e.chatChunk(openai.Delta{Role: "assistant", Content: &empty}, nil)
	}
}

func (e *sseEmitter) reasoning(s string) {
	if s != "" && e.chat {
		e.chatChunk(openai.Delta{ReasoningContent: &s}, nil)
	}
}

func (e *sseEmitter) content(s string) {
	if s == "" {
		return
	}
	if e.chat {
		e.chatChunk(openai.Delta{Content: &s}, nil)
	} else {
		e.textChunk(s, nil)
	}
}

func (e *sseEmitter) tools(ds []openai.ToolCallDelta) {
	if len(ds) > 0 {
		e.toolsSeen = true
		e.chatChunk(openai.Delta{ToolCalls: ds}, nil)
	}
}

func (e *sseEmitter) logprob(lp openai.TokenLogprob) { e.lps = append(e.lps, lp) }

func (e *sseEmitter) finish(reason string, u openai.Usage, _ []openai.ToolCall) {
	if e.chat {
		e.chatChunk(openai.Delta{}, &reason)
	} else {
		e.textChunk("", &reason)
	}
	e.usage = u
	if e.multi {
		return
	}
	e.end(u)
}

// end writes the usage chunk (with include_usage) and [DONE].
func (e *sseEmitter) end(u openai.Usage) {
	if e.includeUsage {
		if e.chat {
			e.event(openai.ChatCompletionChunk{ID: e.id, Object: openai.ObjectChatChunk, Created: e.created, Model: e.model,
				Choices: []openai.ChunkChoice{}, Usage: &u})
		} else {
			e.event(openai.Completion{ID: e.id, Object: openai.ObjectCompletion, Created: e.created, Model: e.model,
				Choices: []openai.CompletionChoice{}, Usage: &u})
		}
	}
	e.done()
}

func (e *sseEmitter) fail(a *openai.Error) {
	e.event(a.Body())
	if !e.multi {
		e.done()
	}
}

func (e *sseEmitter) done() {
	if e.lock != nil {
		e.lock.Lock()
		defer e.lock.Unlock()
	}
	if e.broken {
		return
	}
	_, _ = e.w.WriteString("data: [DONE]\n\n")
	if e.w.Flush() != nil {
		e.broken = true
		e.gone()
	}
}
