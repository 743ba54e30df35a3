package router

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"strconv"
	"time"
)

// apiError is an OpenAI-style error: {"error":{"message","type","param","code"}}.
type apiError struct {
	status  int
	typ     string
	code    string
	param   string
	message string
	retry   time.Duration // Retry-After when > 0
}

func (e *apiError) Error() string { return e.message }

func badField(param, format string, args ...any) *apiError {
	return &apiError{status: http.StatusBadRequest, typ: "invalid_request_error", param: param,
		message: fmt.Sprintf(format, args...)}
}

func (e *apiError) body() []byte {
	var param, code any
	if e.param != "" {
		param = e.param
	}
	if e.code != "" {
		code = e.code
	}
	b, _ := json.Marshal(map[string]any{"error": map[string]any{"message": e.message, "type": e.typ, "param": param, "code": code}})
	return b
}

func writeError(w http.ResponseWriter, e *apiError) {
	if e.retry > 0 {
		w.Header().Set("Retry-After", strconv.Itoa(max(1, int(math.Ceil(e.retry.Seconds())))))
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(e.status)
	_, _ = w.Write(append(e.body(), '\n'))
}

// genRequest is what the router needs from a /v1/completions or
// /v1/chat/completions body; raw keeps every field for the prefill call.
type genRequest struct {
	chat         bool
	raw          map[string]json.RawMessage
	model        string
	stream       bool
	includeUsage bool
	maxTokens    int // generated tokens including the first; 0: only max_seq_len limits
	stop         []string
	temperature  float64
	topP         float64
	topK         int
	seed         *uint64
	ignoreEOS    bool
	stopTokenIDs []int
	skipSpecial  bool
	includeStop  bool
}

// fields decodes raw fields, treating JSON null as absent, and names the
// field in every error.
type fields map[string]json.RawMessage

func (f fields) get(name string, dst any) (bool, *apiError) {
	v, ok := f[name]
	if !ok || bytes.Equal(bytes.TrimSpace(v), []byte("null")) {
		return false, nil
	}
	if err := json.Unmarshal(v, dst); err != nil {
		return true, badField(name, "field %s: %s is not %s", name, short(v), kindOf(dst))
	}
	return true, nil
}

func short(b []byte) string {
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
	case *uint64:
		return "a non-negative integer"
	case *float64:
		return "a number"
	case *[]int:
		return "an array of integers"
	case *map[string]json.RawMessage:
		return "an object"
	case *[]json.RawMessage:
		return "an array"
	}
	return "of the expected type"
}

// samplingDefaults are the model's generation_config.json values, which
// vLLM also applies to requests that leave a field out.
type samplingDefaults struct {
	Temperature *float64 `json:"temperature"`
	TopP        *float64 `json:"top_p"`
	TopK        *int     `json:"top_k"`
}

// parseGen checks a request body. Only what TileRT decode can honour is
// accepted; anything else is refused with 400 naming the field rather than
// silently ignored.
func (rt *Router) parseGen(body []byte, chat bool) (*genRequest, *apiError) {
	var raw map[string]json.RawMessage
	if err := json.Unmarshal(body, &raw); err != nil || raw == nil {
		msg := "the body is not a JSON object"
		if err != nil {
			msg += ": " + err.Error()
		}
		return nil, &apiError{status: http.StatusBadRequest, typ: "invalid_request_error", message: msg}
	}
	f := fields(raw)
	r := &genRequest{chat: chat, raw: raw, skipSpecial: true}
	if _, e := f.get("model", &r.model); e != nil {
		return nil, e
	}
	if r.model == "" {
		r.model = rt.served
	} else if !rt.knownModel(r.model) {
		return nil, &apiError{status: http.StatusBadRequest, typ: "invalid_request_error", param: "model", code: "model_not_found",
			message: fmt.Sprintf("field model: %q is not served here; this router serves %q", r.model, rt.served)}
	}
	if chat {
		var msgs []json.RawMessage
		ok, e := f.get("messages", &msgs)
		if e != nil {
			return nil, e
		}
		if !ok || len(msgs) == 0 {
			return nil, badField("messages", "field messages: missing or empty")
		}
		if ok, e := nonEmpty(f, "tools"); e != nil || ok {
			return nil, orUnsupported(e, "tools", "tool calling is not supported by the TileRT router yet")
		}
		if _, ok := f["functions"]; ok {
			return nil, badField("functions", "field functions: function calling is not supported by the TileRT router yet")
		}
	} else {
		if e := checkPrompt(f); e != nil {
			return nil, e
		}
		var echo bool
		if _, e := f.get("echo", &echo); e != nil || echo {
			return nil, orUnsupported(e, "echo", "echo is not supported by the TileRT router")
		}
		var suffix string
		if _, e := f.get("suffix", &suffix); e != nil || suffix != "" {
			return nil, orUnsupported(e, "suffix", "suffix is not supported by the TileRT router")
		}
		var bestOf int
		if _, e := f.get("best_of", &bestOf); e != nil || bestOf > 1 {
			return nil, orUnsupported(e, "best_of", "only best_of 1 is supported")
		}
	}
	var n int
	if ok, e := f.get("n", &n); e != nil || (ok && n != 1) {
		return nil, orUnsupported(e, "n", fmt.Sprintf("only n=1 is supported (got %d); send separate requests", n))
	}
	if e := r.parseLimits(f); e != nil {
		return nil, e
	}
	if e := r.parseSampling(f, rt.defaults); e != nil {
		return nil, e
	}
	return r, nil
}

func orUnsupported(e *apiError, field, msg string) *apiError {
	if e != nil {
		return e
	}
	return badField(field, "field %s: %s", field, msg)
}

// nonEmpty reports whether field is present as a non-empty array.
func nonEmpty(f fields, name string) (bool, *apiError) {
	var a []json.RawMessage
	ok, e := f.get(name, &a)
	return ok && len(a) > 0, e
}

// checkPrompt accepts one prompt: a string, an array of token ids, or an
// array holding one of those (the batched forms with several are refused).
func checkPrompt(f fields) *apiError {
	v, ok := f["prompt"]
	if !ok || bytes.Equal(bytes.TrimSpace(v), []byte("null")) {
		return badField("prompt", "field prompt: missing")
	}
	var s string
	if json.Unmarshal(v, &s) == nil {
		if s == "" {
			return badField("prompt", "field prompt: empty")
		}
		return nil
	}
	var ids []int
	if json.Unmarshal(v, &ids) == nil {
		if len(ids) == 0 {
			return badField("prompt", "field prompt: empty")
		}
		return nil
	}
	var list []json.RawMessage
	if json.Unmarshal(v, &list) == nil {
		if len(list) != 1 {
			return badField("prompt", "field prompt: %d prompts in one request; the TileRT router takes one (send separate requests)", len(list))
		}
		return checkPrompt(fields{"prompt": list[0]})
	}
	return badField("prompt", "field prompt: want a string, an array of token ids, or an array with one of those")
}

func (r *genRequest) parseLimits(f fields) *apiError {
	if _, e := f.get("stream", &r.stream); e != nil {
		return e
	}
	var so map[string]json.RawMessage
	if ok, e := f.get("stream_options", &so); e != nil {
		return e
	} else if ok {
		if !r.stream {
			return badField("stream_options", "field stream_options: only allowed with stream true")
		}
		if _, e := fields(so).get("include_usage", &r.includeUsage); e != nil {
			e.param, e.message = "stream_options.include_usage", "field stream_options."+e.message[len("field "):]
			return e
		}
	}
	names := []string{"max_tokens"}
	if r.chat {
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
			return badField(name, "field %s: %v must be a whole number >= 1", name, v)
		}
		r.maxTokens = int(v)
		break
	}
	if r.maxTokens == 0 && !r.chat {
		r.maxTokens = 16 // OpenAI's (and vLLM's) completions default
	}
	if v, ok := f["stop"]; ok && !bytes.Equal(bytes.TrimSpace(v), []byte("null")) {
		var one string
		if json.Unmarshal(v, &one) == nil {
			r.stop = []string{one}
		} else if json.Unmarshal(v, &r.stop) != nil {
			return badField("stop", "field stop: want a string or an array of strings")
		}
		kept := r.stop[:0]
		for _, s := range r.stop {
			if s != "" {
				kept = append(kept, s)
			}
		}
		r.stop = kept
	}
	if _, e := f.get("stop_token_ids", &r.stopTokenIDs); e != nil {
		return e
	}
	if _, e := f.get("ignore_eos", &r.ignoreEOS); e != nil {
		return e
	}
	if _, e := f.get("skip_special_tokens", &r.skipSpecial); e != nil {
		return e
	}
	if _, e := f.get("include_stop_str_in_output", &r.includeStop); e != nil {
		return e
	}
	if r.chat {
		var lp bool
		if _, e := f.get("logprobs", &lp); e != nil || lp {
			return orUnsupported(e, "logprobs", "logprobs are not returned by the TileRT decode pool")
		}
		var top int
		if _, e := f.get("top_logprobs", &top); e != nil || top > 0 {
			return orUnsupported(e, "top_logprobs", "logprobs are not returned by the TileRT decode pool")
		}
	} else {
		var lp int
		if ok, e := f.get("logprobs", &lp); e != nil || ok {
			return orUnsupported(e, "logprobs", "logprobs are not returned by the TileRT decode pool")
		}
	}
	var rf map[string]json.RawMessage
	if ok, e := f.get("response_format", &rf); e != nil {
		return e
	} else if ok && string(bytes.TrimSpace(rf["type"])) != `"text"` {
		return badField("response_format", "field response_format: structured output is not supported by the TileRT decode pool")
	}
	return nil
}

func (r *genRequest) parseSampling(f fields, d samplingDefaults) *apiError {
	r.temperature, r.topP, r.topK = 1, 1, 0
	if d.Temperature != nil {
		r.temperature = *d.Temperature
	}
	if d.TopP != nil {
		r.topP = *d.TopP
	}
	if d.TopK != nil {
		r.topK = *d.TopK
	}
	if _, e := f.get("temperature", &r.temperature); e != nil {
		return e
	}
	if r.temperature < 0 || math.IsNaN(r.temperature) {
		return badField("temperature", "field temperature: %g is negative", r.temperature)
	}
	if _, e := f.get("top_p", &r.topP); e != nil {
		return e
	}
	if r.topP <= 0 || r.topP > 1 {
		return badField("top_p", "field top_p: %g is outside (0, 1]", r.topP)
	}
	if _, e := f.get("top_k", &r.topK); e != nil {
		return e
	}
	if r.topK < -1 {
		return badField("top_k", "field top_k: %d (use -1 or 0 to disable)", r.topK)
	}
	var seed int64
	if ok, e := f.get("seed", &seed); e != nil {
		return e
	} else if ok {
		u := uint64(seed)
		r.seed = &u
	}
	// Penalties would change every token the decode node samples, which it
	// does not implement: refuse rather than ignore.
	for _, p := range []struct {
		name string
		none float64
	}{{"frequency_penalty", 0}, {"presence_penalty", 0}, {"repetition_penalty", 1}} {
		var v float64
		if ok, e := f.get(p.name, &v); e != nil || (ok && v != p.none) {
			return orUnsupported(e, p.name, fmt.Sprintf("%g is not supported by the TileRT decode pool (only %g)", v, p.none))
		}
	}
	var minTok int
	if _, e := f.get("min_tokens", &minTok); e != nil || minTok > 0 {
		return orUnsupported(e, "min_tokens", "min_tokens is not supported by the TileRT decode pool")
	}
	return nil
}

// prefillBody is the body sent to vLLM: the client's, with one token to
// generate, no streaming, the first token's id in the logprobs, the
// resolved sampling, and the decode node vLLM's connector ships state to.
func (r *genRequest) prefillBody(model string, n *node, rid string) ([]byte, error) {
	out := make(map[string]any, len(r.raw)+4)
	for k, v := range r.raw {
		out[k] = v
	}
	delete(out, "stream_options")
	delete(out, "max_completion_tokens")
	// The router applies stop strings to the whole text itself.
	delete(out, "stop")
	out["model"] = model
	out["max_tokens"] = 1
	out["stream"] = false
	if r.chat {
		out["logprobs"], out["top_logprobs"] = true, 0
	} else {
		out["logprobs"] = 1
	}
	out["temperature"], out["top_p"], out["top_k"] = r.temperature, r.topP, r.topK
	out["kv_transfer_params"] = map[string]any{"tilert_host": n.host, "tilert_ctrl_port": n.ctrlPort, "tilert_rid": rid}
	return json.Marshal(out)
}
