// Package devvllm is `tilert dev-vllm`: a development stand-in for "vLLM
// prefill + the TileRT connector + the sidecar", so the whole TileRT stack
// (router, decode node) runs on a CPU without a GPU.
//
// It is NOT vLLM. It serves the small part of vLLM's OpenAI API that
// `tilert router` uses: POST /v1/completions and /v1/chat/completions for
// requests carrying kv_transfer_params {tilert_host, tilert_ctrl_port,
// tilert_rid} with max_tokens 1. For each it tokenises the prompt, prefills
// it on the pure-Go CPU engine (serving mode: caches in vLLM's layouts, the
// MTP layer included), hands the state to the named decode node over the
// ctrl protocol and a transfer engine (the same code as `tilert
// dev-prefill`), and answers with the one sampled token, its id in the
// logprobs as "token_id:N", as vLLM does with --return-tokens-as-token-ids.
//
// Known differences from vLLM, on purpose:
//   - Chat messages are rendered with a documented fallback (see
//     RenderChat), not the tokenizer's Jinja chat_template: there is no
//     Jinja engine here. Every chat request says so in the log.
//   - The logprob values are null: only the token string is meaningful.
//   - Requests without kv_transfer_params.tilert_host, or with max_tokens
//     other than 1, are refused (400): it only prefills for TileRT.
//   - Prefills run one at a time.
package devvllm

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/cockroachdb/errors"
	"github.com/valyala/fasthttp"

	"github.com/tilert-go/tilert/api/decodeapi"
	"github.com/tilert-go/tilert/config"
	"github.com/tilert-go/tilert/engine"
	"github.com/tilert-go/tilert/internal/devprefill"
	"github.com/tilert-go/tilert/internal/fastserve"
	"github.com/tilert-go/tilert/openai/parsers"
	"github.com/tilert-go/tilert/rdma/transfer"
	"github.com/tilert-go/tilert/tokenizer"
)

// Options configure a Server.
type Options struct {
	Shipper     *devprefill.Shipper
	Tokenizer   *tokenizer.Tokenizer
	ServedModel string
	Log         *slog.Logger
}

// Server is the dev stand-in's HTTP API.
type Server struct {
	o       Options
	eos     []int
	created int64
}

// New returns a Server prefilling with o.Shipper.
func New(o Options) *Server {
	if o.Log == nil {
		o.Log = slog.Default()
	}
	eos := o.Shipper.Config().EOS
	if len(eos) == 0 {
		eos = o.Tokenizer.EOS()
	}
	return &Server{o: o, eos: eos, created: time.Now().Unix()}
}

// maxBody bounds a request body, as vLLM's own server does.
const maxBody = 32 << 20

// Handler serves /v1/completions, /v1/chat/completions, /v1/models, /health.
func (s *Server) Handler() fasthttp.RequestHandler {
	return fastserve.Routes(map[string]fastserve.Route{
		"/v1/completions":      {Method: fasthttp.MethodPost, Handler: func(ctx *fasthttp.RequestCtx) { s.serve(ctx, false) }},
		"/v1/chat/completions": {Method: fasthttp.MethodPost, Handler: func(ctx *fasthttp.RequestCtx) { s.serve(ctx, true) }},
		"/v1/models": {Method: fasthttp.MethodGet, Handler: func(ctx *fasthttp.RequestCtx) {
			fastserve.WriteJSON(ctx, fasthttp.StatusOK, map[string]any{"object": "list", "data": []any{map[string]any{
				"id": s.o.ServedModel, "object": "model", "created": s.created, "owned_by": "tilert-dev-vllm"}}})
		}},
		"/health": {Method: fasthttp.MethodGet, Handler: func(ctx *fasthttp.RequestCtx) { ctx.SetStatusCode(fasthttp.StatusOK) }},
	}, func(ctx *fasthttp.RequestCtx, status int, msg string) {
		writeErr(ctx, &httpErr{status: status, msg: msg})
	})
}

// NewHTTPServer is the fasthttp server for Handler.
func (s *Server) NewHTTPServer() *fasthttp.Server {
	return &fasthttp.Server{Handler: s.Handler(), Name: "tilert-dev-vllm", ReadTimeout: 30 * time.Second,
		IdleTimeout: 2 * time.Minute, MaxRequestBodySize: maxBody, Logger: fastserve.Logger{Log: s.o.Log, Name: "dev-vllm"}}
}

type httpErr struct {
	status int
	msg    string
}

func fail(status int, format string, args ...any) *httpErr {
	return &httpErr{status: status, msg: fmt.Sprintf(format, args...)}
}

func writeErr(ctx *fasthttp.RequestCtx, e *httpErr) {
	typ := "BadRequestError"
	if e.status >= 500 {
		typ = "InternalServerError"
	}
	fastserve.WriteJSON(ctx, e.status, map[string]any{"error": map[string]any{"message": e.msg, "type": typ, "param": nil, "code": e.status}})
}

// request holds the fields the stand-in reads.
type request struct {
	Model    string            `json:"model"`
	Prompt   json.RawMessage   `json:"prompt"`
	Messages []json.RawMessage `json:"messages"`
	// MaxTokens must be 1: the router asks for the first token only.
	MaxTokens    *int     `json:"max_tokens"`
	Temperature  *float64 `json:"temperature"`
	TopP         *float64 `json:"top_p"`
	TopK         *int     `json:"top_k"`
	MinP         float64  `json:"min_p"`
	Seed         *int64   `json:"seed"`
	IgnoreEOS    bool     `json:"ignore_eos"`
	StopTokenIDs []int    `json:"stop_token_ids"`
	Stream       bool     `json:"stream"`
	// Sampling controls applied to the one token, as vLLM does.
	PresencePenalty   float64            `json:"presence_penalty"`
	FrequencyPenalty  float64            `json:"frequency_penalty"`
	RepetitionPenalty float64            `json:"repetition_penalty"`
	MinTokens         int                `json:"min_tokens"`
	LogitBias         map[string]float64 `json:"logit_bias"`
	BadWords          []string           `json:"bad_words"`
	ThinkingBudget    *int               `json:"thinking_token_budget"`
	PromptLogprobs    *int               `json:"prompt_logprobs"`
	ReturnPromptText  bool               `json:"return_prompt_text"`
	Logprobs          json.RawMessage    `json:"logprobs"` // chat: bool; completions: int
	TopLogprobs       int                `json:"top_logprobs"`
	ReturnTokenIDs    bool               `json:"return_token_ids"`
	KV                *struct {
		Host     string `json:"tilert_host"`
		CtrlPort int    `json:"tilert_ctrl_port"`
		RID      string `json:"tilert_rid"`
	} `json:"kv_transfer_params"`
}

func (s *Server) serve(ctx *fasthttp.RequestCtx, chat bool) {
	t0 := time.Now()
	var probe request
	if json.Unmarshal(ctx.PostBody(), &probe) == nil && probe.KV == nil {
		s.native(ctx, chat)
		return
	}
	resp, e := s.handle(ctx, chat)
	if e != nil {
		s.o.Log.Warn("dev-vllm: request refused", "path", string(ctx.Path()), "status", e.status, "err", e.msg)
		writeErr(ctx, e)
		return
	}
	s.o.Log.Info("dev-vllm: prefilled and shipped", "path", string(ctx.Path()), "took", time.Since(t0).Round(time.Microsecond))
	fastserve.WriteJSON(ctx, fasthttp.StatusOK, resp)
}

func (s *Server) handle(ctx *fasthttp.RequestCtx, chat bool) (map[string]any, *httpErr) {
	body := ctx.PostBody()
	var req request
	if err := json.Unmarshal(body, &req); err != nil {
		return nil, fail(fasthttp.StatusBadRequest, "the body is not a valid request: %v", err)
	}
	if req.Model != "" && req.Model != s.o.ServedModel {
		return nil, fail(fasthttp.StatusNotFound, "the model `%s` does not exist (dev-vllm serves %q)", req.Model, s.o.ServedModel)
	}
	if req.KV == nil || req.KV.Host == "" || req.KV.CtrlPort <= 0 || req.KV.RID == "" {
		return nil, fail(fasthttp.StatusBadRequest, "dev-vllm prefills for TileRT only with kv_transfer_params "+
			"{tilert_host, tilert_ctrl_port, tilert_rid} (send it through tilert router); without them it generates natively")
	}
	if req.MaxTokens == nil || *req.MaxTokens != 1 {
		return nil, fail(fasthttp.StatusBadRequest, "dev-vllm only prefills: max_tokens must be 1 (tilert router sets it)")
	}
	prompt, e := s.promptIDs(&req, chat)
	if e != nil {
		return nil, e
	}
	p := engine.Params{Temperature: 1, TopP: 1, MaxTokens: 1}
	if req.Temperature != nil {
		p.Temperature = *req.Temperature
	}
	if req.TopP != nil {
		p.TopP = *req.TopP
	}
	if req.TopK != nil {
		p.TopK = max(*req.TopK, 0)
	}
	if req.Seed != nil {
		p.Seed = uint64(*req.Seed)
	} else {
		p.Seed = rand.Uint64()
	}
	p.PresencePenalty, p.FrequencyPenalty, p.RepetitionPenalty, p.MinTokens = req.PresencePenalty, req.FrequencyPenalty, req.RepetitionPenalty, req.MinTokens
	p.PromptIDs = prompt
	if e := s.filters(&req, prompt, &p); e != nil {
		return nil, e
	}
	p.StopIDs = append(p.StopIDs, req.StopTokenIDs...)
	if !req.IgnoreEOS {
		p.StopIDs = append(p.StopIDs, s.eos...) // min_tokens blocks them
	}
	for k, v := range req.LogitBias {
		if id, err := strconv.Atoi(k); err == nil {
			if p.LogitBias == nil {
				p.LogitBias = map[int]float32{}
			}
			p.LogitBias[id] = float32(min(100, max(-100, v)))
		}
	}
	top := req.TopLogprobs
	if !chat {
		_ = json.Unmarshal(req.Logprobs, &top)
	}
	p.Logprobs, p.TopLogprobs = true, min(max(top, 0), 20)
	ctrl := net.JoinHostPort(req.KV.Host, strconv.Itoa(req.KV.CtrlPort))
	h, err := s.o.Shipper.Ship(ctx, ctrl, req.KV.RID, prompt, p)
	if err != nil {
		if errors.Is(err, engine.ErrTooLong) {
			return nil, fail(fasthttp.StatusBadRequest, "the prompt is too long: %v", err)
		}
		return nil, fail(fasthttp.StatusInternalServerError, "prefill and handoff of %s to %s failed: %v", req.KV.RID, ctrl, err)
	}
	s.o.Log.Info("dev-vllm: handoff", "rid", req.KV.RID, "node", ctrl, "prompt_tokens", len(prompt), "first", h.First,
		"slot", h.Ack.Slot, "bytes", h.Bytes, "prefill", h.Prefill.Round(time.Microsecond), "send", h.Send.Round(time.Microsecond))

	finish := "length"
	if slices.Contains(req.StopTokenIDs, h.First) || (!req.IgnoreEOS && slices.Contains(s.eos, h.First)) {
		finish = "stop"
	}
	text := s.o.Tokenizer.Decode([]int{h.First}, true)
	tokStr := "token_id:" + strconv.Itoa(h.First)
	choice := map[string]any{"index": 0, "finish_reason": finish, "stop_reason": nil}
	var lp any // the first token's raw logprob, as vLLM's default raw_logprobs
	var chatTop []any
	compTop := map[string]float64{}
	if h.FirstLP != nil {
		lp = h.FirstLP.Logprob
		for _, a := range h.FirstLP.Top {
			ts := "token_id:" + strconv.Itoa(a.ID)
			chatTop = append(chatTop, map[string]any{"token": ts, "logprob": a.Logprob, "bytes": nil})
			compTop[ts] = float64(a.Logprob)
		}
		compTop[tokStr] = float64(h.FirstLP.Logprob)
	}
	if chatTop == nil {
		chatTop = []any{}
	}
	if chat {
		choice["message"] = map[string]any{"role": "assistant", "content": text}
		choice["logprobs"] = map[string]any{"content": []any{map[string]any{"token": tokStr, "logprob": lp, "bytes": nil, "top_logprobs": chatTop}}}
	} else {
		choice["text"] = text
		choice["logprobs"] = map[string]any{"tokens": []string{tokStr}, "token_logprobs": []any{lp}, "top_logprobs": []any{compTop}, "text_offset": []int{0}}
		if req.ReturnTokenIDs {
			choice["prompt_token_ids"], choice["token_ids"] = prompt, []int{h.First}
		}
	}
	object, id := "text_completion", "cmpl-"+req.KV.RID
	if chat {
		object, id = "chat.completion", "chatcmpl-"+req.KV.RID
	}
	out := map[string]any{"id": id, "object": object, "created": time.Now().Unix(), "model": s.o.ServedModel,
		"choices": []any{choice}, "kv_transfer_params": nil,
		"usage": map[string]int{"prompt_tokens": len(prompt), "completion_tokens": 1, "total_tokens": len(prompt) + 1}}
	if chat && req.ReturnTokenIDs {
		out["prompt_token_ids"] = prompt // vLLM >= 0.10.2 with return_token_ids
	}
	if chat && req.ReturnPromptText {
		out["prompt_text"] = s.o.Tokenizer.Decode(prompt, false) // the fallback rendering
	}
	return out, nil
}

func (s *Server) promptIDs(req *request, chat bool) ([]int, *httpErr) {
	tok := s.o.Tokenizer
	if chat {
		if len(req.Messages) == 0 {
			return nil, fail(fasthttp.StatusBadRequest, "messages: missing or empty")
		}
		text, err := RenderChat(tok, req.Messages)
		if err != nil {
			return nil, fail(fasthttp.StatusBadRequest, "messages: %v", err)
		}
		s.o.Log.Info("dev-vllm: chat rendered with the fallback format, not the model's chat_template (no Jinja engine in this dev stand-in)")
		ids, err := tok.Encode(text, false)
		if err != nil {
			return nil, fail(fasthttp.StatusBadRequest, "tokenising messages: %v", err)
		}
		return ids, nil
	}
	var str string
	if json.Unmarshal(req.Prompt, &str) == nil {
		ids, err := tok.Encode(str, true)
		if err != nil {
			return nil, fail(fasthttp.StatusBadRequest, "tokenising prompt: %v", err)
		}
		if len(ids) == 0 {
			return nil, fail(fasthttp.StatusBadRequest, "prompt: empty")
		}
		return ids, nil
	}
	var ids []int
	if json.Unmarshal(req.Prompt, &ids) == nil && len(ids) > 0 {
		for i, id := range ids {
			if id < 0 || id >= tok.VocabSize() {
				return nil, fail(fasthttp.StatusBadRequest, "prompt[%d]: token id %d is outside the vocabulary [0, %d)", i, id, tok.VocabSize())
			}
		}
		return ids, nil
	}
	var list []json.RawMessage
	if json.Unmarshal(req.Prompt, &list) == nil && len(list) == 1 {
		one := *req
		one.Prompt = list[0]
		return s.promptIDs(&one, false)
	}
	return nil, fail(fasthttp.StatusBadRequest, "prompt: want a string, an array of token ids, or an array with one of those")
}

// RenderChat is the fallback chat rendering, used because this stand-in has
// no Jinja engine to run the tokenizer's chat_template:
//
//   - when the vocabulary has GLM-style role tokens (<|user|>,
//     <|assistant|>): "[gMASK]<sop>" (when those tokens exist), then
//     "<|role|>\n" + content per message, then "<|assistant|>\n";
//   - otherwise: "role: content\n" per message, then "assistant:".
//
// Content is a string or an array of {"type":"text","text":...} parts.
func RenderChat(tok *tokenizer.Tokenizer, msgs []json.RawMessage) (string, error) {
	_, glmUser := tok.TokenID("<|user|>")
	_, glmAsst := tok.TokenID("<|assistant|>")
	glm := glmUser && glmAsst
	var sb strings.Builder
	if glm {
		for _, t := range []string{"[gMASK]", "<sop>"} {
			if _, ok := tok.TokenID(t); ok {
				sb.WriteString(t)
			}
		}
	}
	for i, raw := range msgs {
		var m struct {
			Role    string          `json:"role"`
			Content json.RawMessage `json:"content"`
		}
		if err := json.Unmarshal(raw, &m); err != nil || m.Role == "" {
			return "", errors.Newf("message %d: want an object with a role", i)
		}
		content, err := messageText(m.Content)
		if err != nil {
			return "", errors.Wrapf(err, "message %d", i)
		}
		if glm {
			fmt.Fprintf(&sb, "<|%s|>\n%s", m.Role, content)
		} else {
			fmt.Fprintf(&sb, "%s: %s\n", m.Role, content)
		}
	}
	if glm {
		sb.WriteString("<|assistant|>\n")
	} else {
		sb.WriteString("assistant:")
	}
	return sb.String(), nil
}

func messageText(raw json.RawMessage) (string, error) {
	if len(raw) == 0 || string(raw) == "null" {
		return "", nil
	}
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s, nil
	}
	var parts []struct {
		Type string `json:"type"`
		Text string `json:"text"`
	}
	if err := json.Unmarshal(raw, &parts); err != nil {
		return "", errors.New("content: want a string or an array of text parts")
	}
	var sb strings.Builder
	for _, p := range parts {
		if p.Type != "text" {
			return "", errors.Newf("content part of type %q: only text parts are supported", p.Type)
		}
		sb.WriteString(p.Text)
	}
	return sb.String(), nil
}

// RunOptions configure Run.
type RunOptions struct {
	ModelDir    string
	Host        string
	Port        int
	ServedModel string
	Transfer    string // tcp or nixl
	MaxSeqLen   int
	AddrFile    string
	Secret      []byte // proven to the decode nodes (security.secret_file)
}

// Run serves the stand-in until ctx ends.
func Run(ctx context.Context, o RunOptions) error {
	w, mcfg, closeW, err := loadWeights(o.ModelDir)
	if err != nil {
		return err
	}
	defer closeW()
	tok, err := tokenizer.Load(o.ModelDir)
	if err != nil {
		return errors.WithHintf(err, "--model-dir %s must hold tokenizer.json", o.ModelDir)
	}
	tr, err := transfer.NewSender(config.Transfer{Engine: o.Transfer}, o.Secret)
	if err != nil {
		return err
	}
	defer tr.Close()
	sh := devprefill.NewShipper(w, mcfg, tr, o.MaxSeqLen).WithSecret(o.Secret)
	defer sh.Close()
	if o.ServedModel == "" {
		o.ServedModel = baseName(o.ModelDir)
	}
	srv := New(Options{Shipper: sh, Tokenizer: tok, ServedModel: o.ServedModel})
	ln, err := net.Listen("tcp", net.JoinHostPort(o.Host, strconv.Itoa(o.Port)))
	if err != nil {
		return errors.WithHint(errors.Wrap(err, "dev-vllm: listen"), "pick a free --port (0 lets the kernel choose)")
	}
	if o.AddrFile != "" {
		if err := writeAddr(o.AddrFile, ln.Addr().String()); err != nil {
			_ = ln.Close()
			return err
		}
	}
	slog.Warn("dev-vllm: a development stand-in for vLLM prefill + TileRT connector + sidecar (CPU engine, fallback chat rendering); not vLLM",
		"addr", ln.Addr().String(), "model", o.ServedModel, "dir", o.ModelDir, "transfer", tr.Kind())
	return fastserve.Serve(ctx, srv.NewHTTPServer(), ln, 10*time.Second)
}

// filters applies min_p, bad_words and thinking_token_budget as vLLM does
// (bad words tokenised by vLLM's rule, tokenizer.BadWords; the budget
// between the reasoning parsers' tags).
func (s *Server) filters(req *request, prompt []int, p *engine.Params) *httpErr {
	if req.PromptLogprobs != nil && *req.PromptLogprobs != 0 {
		return fail(fasthttp.StatusBadRequest, "prompt_logprobs: dev-vllm does not compute the prompt's logprobs (vLLM does)")
	}
	if !(req.MinP >= 0 && req.MinP <= 1) {
		return fail(fasthttp.StatusBadRequest, "min_p must be in [0, 1], got %g.", req.MinP)
	}
	p.MinP = req.MinP
	if len(req.BadWords) > 0 {
		ids, err := s.o.Tokenizer.BadWords(req.BadWords, decodeapi.MaxBadWords)
		if err != nil {
			return fail(fasthttp.StatusBadRequest, "bad_words: %v", err)
		}
		p.BadWords = ids
	}
	if b := req.ThinkingBudget; b != nil && *b != -1 {
		startTag, endTag := parsers.ReasoningTags()
		start, _ := s.o.Tokenizer.Encode(startTag, false)
		end, _ := s.o.Tokenizer.Encode(endTag, false)
		if *b < 0 || len(start) == 0 || len(end) == 0 {
			return fail(fasthttp.StatusBadRequest, "thinking_token_budget %d: a non-negative budget needs %s and %s in the vocabulary", *b, startTag, endTag)
		}
		p.Think = engine.NewThinkBudget(*b, start, end, prompt)
	}
	return nil
}
