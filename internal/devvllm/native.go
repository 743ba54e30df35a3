package devvllm

import (
	"context"
	"encoding/json"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/tilert-go/tilert/engine"
	"github.com/tilert-go/tilert/internal/fastserve"
)

// native answers a request without TileRT kv_transfer_params by running
// it whole on the local CPU engine, as a native vLLM P/D pool would: the
// stand-in for the endpoint `tilert router --spill-url` sends requests to.
// Streamed answers send one chunk per token.
func (s *Server) native(ctx *fasthttp.RequestCtx, chat bool) {
	var req request
	if err := json.Unmarshal(ctx.PostBody(), &req); err != nil {
		writeErr(ctx, fail(fasthttp.StatusBadRequest, "the body is not a valid request: %v", err))
		return
	}
	if req.Model != "" && req.Model != s.o.ServedModel {
		writeErr(ctx, fail(fasthttp.StatusNotFound, "the model `%s` does not exist (dev-vllm serves %q)", req.Model, s.o.ServedModel))
		return
	}
	prompt, e := s.promptIDs(&req, chat)
	if e != nil {
		writeErr(ctx, e)
		return
	}
	p := engine.Params{Temperature: 1, TopP: 1, MaxTokens: 16}
	if chat {
		p.MaxTokens = 0
	}
	if req.MaxTokens != nil {
		p.MaxTokens = *req.MaxTokens
	}
	if req.Temperature != nil {
		p.Temperature = *req.Temperature
	}
	if req.TopP != nil {
		p.TopP = *req.TopP
	}
	if req.TopK != nil {
		p.TopK = max(*req.TopK, 0)
	}
	p.Seed = rand.Uint64()
	if req.Seed != nil {
		p.Seed = uint64(*req.Seed)
	}
	p.StopIDs = append(p.StopIDs, req.StopTokenIDs...)
	if !req.IgnoreEOS {
		p.StopIDs = append(p.StopIDs, s.eos...)
	}
	if e := s.filters(&req, prompt, &p); e != nil {
		writeErr(ctx, e)
		return
	}
	ids, fin, err := s.o.Shipper.Generate(context.Background(), prompt, p)
	if err != nil {
		writeErr(ctx, fail(fasthttp.StatusInternalServerError, "generating: %v", err))
		return
	}
	finish := string(fin)
	text := s.o.Tokenizer.Decode(ids, true)
	if fin == engine.FinishStop && slices.Contains(p.StopIDs, ids[len(ids)-1]) {
		text = s.o.Tokenizer.Decode(ids[:len(ids)-1], true)
	}
	object, id := "text_completion", "cmpl-native-"+strconv.FormatUint(rand.Uint64(), 16)
	if chat {
		object, id = "chat.completion", "chatcmpl-native-"+strconv.FormatUint(rand.Uint64(), 16)
	}
	usage := map[string]int{"prompt_tokens": len(prompt), "completion_tokens": len(ids), "total_tokens": len(prompt) + len(ids)}
	created := time.Now().Unix()
	choice := func(t string, fin any) map[string]any {
		if chat {
			return map[string]any{"index": 0, "delta": map[string]any{"content": t}, "finish_reason": fin}
		}
		return map[string]any{"index": 0, "text": t, "finish_reason": fin}
	}
	s.o.Log.Info("dev-vllm: generated natively (no kv_transfer_params)", "prompt_tokens", len(prompt), "tokens", len(ids), "finish", finish)
	if !req.Stream {
		c := map[string]any{"index": 0, "finish_reason": finish}
		if chat {
			c["message"] = map[string]any{"role": "assistant", "content": text}
		} else {
			c["text"] = text
		}
		fastserve.WriteJSON(ctx, fasthttp.StatusOK, map[string]any{"id": id, "object": object, "created": created, "model": s.o.ServedModel,
			"choices": []any{c}, "usage": usage})
		return
	}
	if chat {
		object = "chat.completion.chunk"
	}
	ctx.SetContentType("text/event-stream")
	var sb strings.Builder
	send := func(v any) {
		b, _ := json.Marshal(v)
		sb.WriteString("data: " + string(b) + "\n\n")
	}
	dec := s.o.Tokenizer.NewDecoder()
	for i, t := range ids {
		if i == len(ids)-1 && fin == engine.FinishStop && slices.Contains(p.StopIDs, t) {
			break
		}
		if piece := dec.Add(t); piece != "" && !s.o.Tokenizer.IsSpecial(t) {
			send(map[string]any{"id": id, "object": object, "created": created, "model": s.o.ServedModel, "choices": []any{choice(piece, nil)}})
		}
	}
	if rest := dec.Flush(); rest != "" {
		send(map[string]any{"id": id, "object": object, "created": created, "model": s.o.ServedModel, "choices": []any{choice(rest, nil)}})
	}
	send(map[string]any{"id": id, "object": object, "created": created, "model": s.o.ServedModel, "choices": []any{choice("", finish)}})
	sb.WriteString("data: [DONE]\n\n")
	// Generated in one go on the CPU: the chunks go out together.
	ctx.SetBodyString(sb.String())
}
