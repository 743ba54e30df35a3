package router

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/tilert-go/tilert/api/decodeapi"
	"github.com/tilert-go/tilert/openai"
)

// prefillResult is what the vLLM call gives.
type prefillResult struct {
	first        int
	finish       string // vLLM's finish_reason for its one token
	promptTokens int
	promptIDs    []int                   // with return_token_ids
	firstLP      *decodeapi.TokenLogprob // the first token's logprob (vLLM's)
	// Relayed as vLLM wrote them: prompt_logprobs and the rendered prompt
	// (return_prompt_text), when the client asked.
	promptLogprobs json.RawMessage
	promptText     *string
}

// vllmAnswer is the part of vLLM's prefill answer the router reads.
type vllmAnswer struct {
	Choices []struct {
		FinishReason string `json:"finish_reason"`
		Logprobs     *struct {
			// completions
			Tokens        []string             `json:"tokens"`
			TokenLogprobs []*float64           `json:"token_logprobs"`
			TopLogprobs   []map[string]float64 `json:"top_logprobs"`
			// chat
			Content []struct {
				Token       string   `json:"token"`
				Logprob     *float64 `json:"logprob"`
				TopLogprobs []struct {
					Token   string  `json:"token"`
					Logprob float64 `json:"logprob"`
				} `json:"top_logprobs"`
			} `json:"content"`
		} `json:"logprobs"`
		TokenIDs       []int           `json:"token_ids"`        // completions, return_token_ids
		PromptTokenIDs []int           `json:"prompt_token_ids"` // completions, return_token_ids
		PromptLogprobs json.RawMessage `json:"prompt_logprobs"`  // completions
	} `json:"choices"`
	PromptTokenIDs []int           `json:"prompt_token_ids"` // chat, return_token_ids
	PromptLogprobs json.RawMessage `json:"prompt_logprobs"`  // chat
	PromptText     *string         `json:"prompt_text"`      // chat, return_prompt_text
	Usage          *struct {
		PromptTokens int `json:"prompt_tokens"`
	} `json:"usage"`
}

func upstreamErr(status int, code, format string, args ...any) *openai.Error {
	return &openai.Error{Status: status, Type: "upstream_error", Code: code, Message: fmt.Sprintf(format, args...)}
}

// prefill runs the request on vLLM for one token and reads that token's id
// (and logprob, and the prompt ids when asked for).
func (rt *Router) prefill(ctx context.Context, req *genRequest, n *node, rid string) (*prefillResult, *openai.Error) {
	model := rt.vllmModelName(ctx)
	if model == "" {
		model = req.Model
	}
	body, err := req.prefillBody(model, n, rid)
	if err != nil {
		return nil, &openai.Error{Status: http.StatusInternalServerError, Type: "internal_error", Message: err.Error()}
	}
	path := "/v1/completions"
	if req.Chat {
		path = "/v1/chat/completions"
	}
	hreq, err := http.NewRequestWithContext(ctx, http.MethodPost, rt.vllm+path, bytes.NewReader(body))
	if err != nil {
		return nil, &openai.Error{Status: http.StatusInternalServerError, Type: "internal_error", Message: err.Error()}
	}
	hreq.Header.Set("Content-Type", "application/json")
	resp, err := rt.client.Do(hreq)
	if err != nil {
		return nil, upstreamErr(http.StatusBadGateway, "prefill_unavailable", "the vLLM prefill server at %s is unreachable: %v", rt.vllm, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, maxBody))
	if err != nil {
		return nil, upstreamErr(http.StatusBadGateway, "prefill_failed", "reading the vLLM prefill response: %v", err)
	}
	if resp.StatusCode != http.StatusOK {
		msg := upstreamMessage(b)
		if resp.StatusCode >= 400 && resp.StatusCode < 500 && resp.StatusCode != http.StatusTooManyRequests {
			// The request itself is wrong for the model (prompt too long, bad
			// messages): the client's error, in vLLM's words.
			return nil, &openai.Error{Status: resp.StatusCode, Type: "invalid_request_error", Message: "vLLM prefill refused the request: " + msg}
		}
		return nil, upstreamErr(http.StatusBadGateway, "prefill_failed", "the vLLM prefill server answered %s: %s", resp.Status, msg)
	}
	var out vllmAnswer
	if err := json.Unmarshal(b, &out); err != nil || len(out.Choices) == 0 {
		return nil, upstreamErr(http.StatusBadGateway, "prefill_failed", "the vLLM prefill response has no choices: %s", openai.Short(b))
	}
	c := out.Choices[0]
	res := &prefillResult{first: -1, finish: c.FinishReason, promptIDs: out.PromptTokenIDs}
	if res.promptIDs == nil {
		res.promptIDs = c.PromptTokenIDs
	}
	if req.PromptLogprobs != nil && *req.PromptLogprobs != 0 {
		res.promptLogprobs = out.PromptLogprobs
		if !req.Chat {
			res.promptLogprobs = c.PromptLogprobs
		}
		if len(res.promptLogprobs) == 0 || string(res.promptLogprobs) == "null" {
			return nil, upstreamErr(http.StatusBadGateway, "prefill_failed", "the vLLM prefill response has no prompt_logprobs although the client asked for them")
		}
	}
	if req.ReturnPromptText {
		res.promptText = out.PromptText
	}
	var tok string
	if lp := c.Logprobs; lp != nil {
		switch {
		case req.Chat && len(lp.Content) > 0:
			tok = lp.Content[0].Token
			if lp.Content[0].Logprob != nil {
				res.firstLP = &decodeapi.TokenLogprob{P: *lp.Content[0].Logprob}
				for _, a := range lp.Content[0].TopLogprobs {
					if id, ok := parseTokenID(a.Token); ok {
						res.firstLP.Top = append(res.firstLP.Top, decodeapi.TopLogprob{ID: id, P: a.Logprob})
					}
				}
			}
		case !req.Chat && len(lp.Tokens) > 0:
			tok = lp.Tokens[0]
			if len(lp.TokenLogprobs) > 0 && lp.TokenLogprobs[0] != nil {
				res.firstLP = &decodeapi.TokenLogprob{P: *lp.TokenLogprobs[0]}
				if len(lp.TopLogprobs) > 0 {
					res.firstLP.Top = topFromMap(lp.TopLogprobs[0], req.TopLogprobs)
				}
			}
		}
	}
	if id, ok := parseTokenID(tok); ok {
		res.first = id
	} else if len(c.TokenIDs) > 0 {
		res.first = c.TokenIDs[0]
	} else {
		return nil, upstreamErr(http.StatusBadGateway, "prefill_no_token_id",
			"the vLLM prefill response does not carry the first token as \"token_id:N\" in its logprobs (got %q); run vllm serve with --return-tokens-as-token-ids", tok)
	}
	if res.first < 0 || res.first >= rt.tok.VocabSize() {
		return nil, upstreamErr(http.StatusBadGateway, "prefill_failed",
			"vLLM's first token %d is outside the tokenizer's vocabulary [0, %d): is --model-path the model vLLM serves?", res.first, rt.tok.VocabSize())
	}
	if req.wantPromptIDs && res.promptIDs == nil {
		return nil, upstreamErr(http.StatusBadGateway, "prefill_failed",
			"the vLLM prefill response has no prompt_token_ids although the router asked for them (return_token_ids, vLLM >= 0.10.2); a repetition penalty and a client's return_token_ids need them")
	}
	if out.Usage != nil {
		res.promptTokens = out.Usage.PromptTokens
	}
	return res, nil
}

// topFromMap orders a completions top_logprobs entry (most likely first,
// then by id) and keeps k of them.
func topFromMap(m map[string]float64, k int) []decodeapi.TopLogprob {
	var out []decodeapi.TopLogprob
	for s, p := range m {
		if id, ok := parseTokenID(s); ok {
			out = append(out, decodeapi.TopLogprob{ID: id, P: p})
		}
	}
	for i := 1; i < len(out); i++ {
		for j := i; j > 0 && (out[j].P > out[j-1].P || (out[j].P == out[j-1].P && out[j].ID < out[j-1].ID)); j-- {
			out[j], out[j-1] = out[j-1], out[j]
		}
	}
	return out[:min(k, len(out))]
}

func parseTokenID(s string) (int, bool) {
	rest, ok := strings.CutPrefix(s, "token_id:")
	if !ok {
		return 0, false
	}
	id, err := strconv.Atoi(rest)
	return id, err == nil
}

// upstreamMessage pulls the message out of an error body (OpenAI's
// {"error":{"message"}}, vLLM's older {"message"}, the node's
// {"error":code,"message"}), or returns the body.
func upstreamMessage(b []byte) string {
	var e struct {
		Message string          `json:"message"`
		Error   json.RawMessage `json:"error"`
	}
	if json.Unmarshal(b, &e) == nil {
		var inner struct {
			Message string `json:"message"`
		}
		if json.Unmarshal(e.Error, &inner) == nil && inner.Message != "" {
			return inner.Message
		}
		if e.Message != "" {
			return e.Message
		}
	}
	return strings.TrimSpace(openai.Short(b))
}

// startDecode asks the node to decode rid from the first token on. down
// reports that the node itself is unreachable or leaving (the request may
// go to another node).
func (rt *Router) startDecode(ctx context.Context, d decodeapi.DecodeRequest, n *node) (resp *http.Response, e *openai.Error, down bool) {
	b, _ := json.Marshal(d)
	hreq, err := http.NewRequestWithContext(ctx, http.MethodPost, n.httpURL+decodeapi.PathDecode, bytes.NewReader(b))
	if err != nil {
		return nil, &openai.Error{Status: http.StatusInternalServerError, Type: "internal_error", Message: err.Error()}, false
	}
	hreq.Header.Set("Content-Type", "application/json")
	rt.pdAuth(hreq.Header)
	resp, err = rt.client.Do(hreq)
	if err != nil {
		return nil, upstreamErr(http.StatusServiceUnavailable, "decode_unavailable", "decode node %s is unreachable: %v", n.spec, err), true
	}
	if resp.StatusCode == http.StatusOK {
		return resp, nil, false
	}
	defer resp.Body.Close()
	eb, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<16))
	ne := decodeapi.ParseError(resp.StatusCode, eb)
	switch ne.Code {
	case decodeapi.CodeBusy:
		retry := max(ne.RetryAfter, time.Second)
		return nil, &openai.Error{Status: http.StatusTooManyRequests, Type: "server_busy", Code: "decode_busy", RetryAfter: retry,
			Message: fmt.Sprintf("decode node %s is busy: %s", n.spec, ne.Message)}, false
	case decodeapi.CodeKVTransferTimeout:
		return nil, upstreamErr(http.StatusGatewayTimeout, "kv_transfer_timeout",
			"the prefill state of this request did not reach decode node %s in time (%s); check that vLLM runs the TileRT connector and can reach %s:%d",
			n.spec, ne.Message, n.host, n.ctrlPort), false
	case decodeapi.CodeShuttingDown:
		e := upstreamErr(http.StatusServiceUnavailable, "decode_unavailable", "decode node %s is shutting down: %s", n.spec, ne.Message)
		e.RetryAfter = time.Second
		return nil, e, true
	case decodeapi.CodeBadRequest:
		return nil, &openai.Error{Status: http.StatusBadRequest, Type: "invalid_request_error", Code: "decode_bad_request",
			Message: fmt.Sprintf("decode node %s refused the request: %s", n.spec, ne.Message)}, false
	}
	return nil, upstreamErr(http.StatusBadGateway, "decode_failed", "decode node %s answered %s: %s: %s", n.spec, resp.Status, ne.Code, ne.Message), false
}

// cancelOnNode tells the node to drop rid (its decode, or a state that
// arrived or is on its way). Cancelling is idempotent on the node.
func (rt *Router) cancelOnNode(n *node, rid, reason string, log *slog.Logger) {
	rt.m.cancels.With(reason).Inc()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	b, _ := json.Marshal(decodeapi.CancelRequest{RID: rid})
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, n.httpURL+decodeapi.PathCancel, bytes.NewReader(b))
	if err != nil {
		return
	}
	req.Header.Set("Content-Type", "application/json")
	rt.pdAuth(req.Header)
	resp, err := rt.client.Do(req)
	if err != nil {
		log.Debug("router: /pd/cancel failed", "reason", reason, "err", err.Error())
		return
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	_ = resp.Body.Close()
	log.Debug("router: cancelled on the decode node", "reason", reason)
}

// nodeAlive asks n's /health once, quickly: after a prefill failed, it
// tells a dead decode node (decode_unavailable, try another) from a
// failing prefill.
func (rt *Router) nodeAlive(ctx context.Context, n *node) bool {
	ctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	var h decodeapi.Health
	return rt.getJSON(ctx, n.httpURL+decodeapi.PathHealth, &h) == nil
}
