package router

import (
	"encoding/json"
	"net/http"
	"strings"
)

type usage struct {
	PromptTokens     int `json:"prompt_tokens"`
	CompletionTokens int `json:"completion_tokens"`
	TotalTokens      int `json:"total_tokens"`
}

// emitter writes a generation to the client: SSE chunks or one JSON body.
type emitter interface {
	start()
	text(s string)
	finish(reason string, u usage)
	fail(e *apiError) // after start: the stream ends with an error
}

func newEmitter(w http.ResponseWriter, r *genRequest, model, rid string, created int64) emitter {
	b := base{w: w, chat: r.chat, model: model, created: created}
	if r.chat {
		b.id, b.object = "chatcmpl-"+rid, "chat.completion"
	} else {
		b.id, b.object = "cmpl-"+rid, "text_completion"
	}
	if r.stream {
		return &sseEmitter{base: b, includeUsage: r.includeUsage}
	}
	return &jsonEmitter{base: b}
}

type base struct {
	w       http.ResponseWriter
	chat    bool
	id      string
	object  string
	model   string
	created int64
}

func (b *base) envelope(object string) map[string]any {
	return map[string]any{"id": b.id, "object": object, "created": b.created, "model": b.model}
}

type jsonEmitter struct {
	base
	sb strings.Builder
}

func (e *jsonEmitter) start()        {}
func (e *jsonEmitter) text(s string) { e.sb.WriteString(s) }
func (e *jsonEmitter) fail(a *apiError) {
	writeError(e.w, a)
}

func (e *jsonEmitter) finish(reason string, u usage) {
	m := e.envelope(e.object)
	choice := map[string]any{"index": 0, "logprobs": nil, "finish_reason": reason}
	if e.chat {
		choice["message"] = map[string]any{"role": "assistant", "content": e.sb.String()}
	} else {
		choice["text"] = e.sb.String()
	}
	m["choices"] = []any{choice}
	m["usage"] = u
	writeJSON(e.w, http.StatusOK, m)
}

type sseEmitter struct {
	base
	includeUsage bool
}

func (e *sseEmitter) event(v any) {
	b, _ := json.Marshal(v)
	_, _ = e.w.Write([]byte("data: "))
	_, _ = e.w.Write(b)
	_, _ = e.w.Write([]byte("\n\n"))
	if f, ok := e.w.(http.Flusher); ok {
		f.Flush()
	}
}

func (e *sseEmitter) chunk(choice map[string]any) {
	m := e.envelope(e.object + chunkSuffix(e.chat))
	m["choices"] = []any{choice}
	if e.includeUsage {
		m["usage"] = nil
	}
	e.event(m)
}

func chunkSuffix(chat bool) string {
	if chat {
		return ".chunk"
	}
	return ""
}

func (e *sseEmitter) start() {
	h := e.w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-cache")
	h.Set("X-Accel-Buffering", "no")
	e.w.WriteHeader(http.StatusOK)
	if e.chat {
		e.chunk(map[string]any{"index": 0, "delta": map[string]any{"role": "assistant", "content": ""}, "logprobs": nil, "finish_reason": nil})
	}
}

func (e *sseEmitter) text(s string) {
	if s == "" {
		return
	}
	if e.chat {
		e.chunk(map[string]any{"index": 0, "delta": map[string]any{"content": s}, "logprobs": nil, "finish_reason": nil})
	} else {
		e.chunk(map[string]any{"index": 0, "text": s, "logprobs": nil, "finish_reason": nil})
	}
}

func (e *sseEmitter) finish(reason string, u usage) {
	if e.chat {
		e.chunk(map[string]any{"index": 0, "delta": map[string]any{}, "logprobs": nil, "finish_reason": reason})
	} else {
		e.chunk(map[string]any{"index": 0, "text": "", "logprobs": nil, "finish_reason": reason})
	}
	if e.includeUsage {
		m := e.envelope(e.object + chunkSuffix(e.chat))
		m["choices"] = []any{}
		m["usage"] = u
		e.event(m)
	}
	e.done()
}

func (e *sseEmitter) fail(a *apiError) {
	e.event(map[string]any{"error": map[string]any{"message": a.message, "type": a.typ, "param": nil, "code": a.code}})
	e.done()
}

func (e *sseEmitter) done() {
	_, _ = e.w.Write([]byte("data: [DONE]\n\n"))
	if f, ok := e.w.(http.Flusher); ok {
		f.Flush()
	}
}
