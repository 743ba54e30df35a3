package router

import (
	"encoding/json"
	"slices"
	"testing"

	"github.com/tilert-go/tilert/api/decodeapi"
	"github.com/tilert-go/tilert/openai"
	"github.com/tilert-go/tilert/tokenizer"
)

// recEmitter records what a pipeline emits.
type recEmitter struct {
	rsn, txt string
	deltas   []openai.ToolCallDelta
	lps      int
}

func (e *recEmitter) start()                                         {}
func (e *recEmitter) reasoning(s string)                             { e.rsn += s }
func (e *recEmitter) content(s string)                               { e.txt += s }
func (e *recEmitter) tools(ds []openai.ToolCallDelta)                { e.deltas = append(e.deltas, ds...) }
func (e *recEmitter) logprob(openai.TokenLogprob)                    { e.lps++ }
func (e *recEmitter) tokenID(int)                                    {}
func (e *recEmitter) finish(string, openai.Usage, []openai.ToolCall) {}
func (e *recEmitter) fail(*openai.Error)                             {}
func (e *recEmitter) usageOf(p, c int) openai.Usage                  { return openai.NewUsage(p, c) }

// parallel_tool_calls false keeps tool call 0 alone, in the deltas and in
// the calls returned (vLLM parses the rest and drops them); true keeps
// both.
func TestPipelineParallelToolCalls(t *testing.T) {
	tok, err := tokenizer.Load(tinyModel(t))
	if err != nil {
		t.Fatal(err)
	}
	tools := []openai.Tool{{Type: "function", Function: openai.Function{Name: "f",
		Parameters: json.RawMessage(`{"type":"object","properties":{"a":{"type":"string"}}}`)}}}
	call := func(v string) string {
		return "<tool_call>f<arg_key>a</arg_key><arg_value>" + v + "</arg_value></tool_call>"
	}
	for _, parallel := range []bool{true, false} {
		req := &openai.Request{Chat: true, Tools: tools, ToolChoice: openai.ToolChoice{Mode: openai.ToolChoiceAuto},
			ParallelToolCalls: parallel, IncludeReasoning: true}
		rec := &recEmitter{}
		p := newPipeline(tok, &genRequest{Request: req, toolParser: "glm47"}, rec)
		p.text(call("1"))
		p.text(call("2"))
		calls := p.end()
		idx := map[int]bool{}
		for _, d := range rec.deltas {
			idx[d.Index] = true
		}
		want := 2
		if !parallel {
			want = 1
		}
		if len(calls) != want || len(idx) != want || calls[0].Function.Arguments != `{"a": "1"}` {
			t.Errorf("parallel_tool_calls %v: calls %+v, delta indices %v; want %d", parallel, calls, idx, want)
		}
	}
}

// include_reasoning false drops the reasoning and, as vLLM does, every
// logprob (they would spell the reasoning out); the content stays.
func TestPipelineIncludeReasoning(t *testing.T) {
	tok, err := tokenizer.Load(tinyModel(t))
	if err != nil {
		t.Fatal(err)
	}
	ids, err := tok.Encode("hmm</think>ok", false)
	if err != nil {
		t.Fatal(err)
	}
	for _, include := range []bool{true, false} {
		req := &openai.Request{Chat: true, Logprobs: true, IncludeReasoning: include, ParallelToolCalls: true}
		r := &genRequest{Request: req, reasoning: "glm45", thinking: true}
		r.keepIDs = map[int]bool{}
		if id, ok := tok.TokenID("</think>"); ok {
			r.keepIDs[id] = true
		}
		rec := &recEmitter{}
		p := newPipeline(tok, r, rec)
		for _, id := range ids {
			p.token(id, &decodeapi.TokenLogprob{P: -0.5})
		}
		p.end()
		if rec.txt != "ok" {
			t.Errorf("include_reasoning %v: content %q, want %q", include, rec.txt, "ok")
		}
		if include && (rec.rsn != "hmm" || rec.lps != len(ids)) {
			t.Errorf("include_reasoning true: reasoning %q, %d logprobs; want %q, %d", rec.rsn, rec.lps, "hmm", len(ids))
		}
		if !include && (rec.rsn != "" || rec.lps != 0) {
			t.Errorf("include_reasoning false: reasoning %q, %d logprobs; want none", rec.rsn, rec.lps)
		}
	}
}

// text_offset counts characters, as vLLM's (Python's len), not bytes.
func TestCompletionTextOffsetCharacters(t *testing.T) {
	var b base
	lp := b.completionLogprobs([]openai.TokenLogprob{{Token: "é"}, {Token: "中文"}, {Token: "a"}})
	lp2 := b.completionLogprobs([]openai.TokenLogprob{{Token: "b"}})
	if got := append(lp.TextOffset, lp2.TextOffset...); !slices.Equal(got, []int{0, 1, 3, 4}) {
		t.Fatalf("text offsets %v, want [0 1 3 4]", got)
	}
}
