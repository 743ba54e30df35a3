package router

import (
	"encoding/json"
	"fmt"
	"maps"
	"math"
	"net/http"
	"strconv"
	"time"

	"github.com/tilert-go/tilert/api/decodeapi"
	"github.com/tilert-go/tilert/openai"
	"github.com/tilert-go/tilert/tokenizer"
)

// genRequest is a checked request with what the router resolved for it.
type genRequest struct {
	*openai.Request
	model                   string // the name answered with
	temperature, topP, minP float64
	topK                    int
	badWords                [][]int        // bad_words as token id sequences
	defaulted               map[string]any // generation_config.json values the client left out, sent to vLLM too
	seedSet                 bool           // seed differs from the client's (a choice of n > 1): sent to vLLM
	thinkStart, thinkEnd    []int          // the reasoning parser's tags (thinking_token_budget)
	thinkIDs                [2]int         // the same as single ids, -1 none (usage's reasoning_tokens)
	seed                    *uint64
	stopIDs                 []int        // ids that end the generation without adding text
	keepIDs                 map[int]bool // special ids kept as text (parser tags)
	toolParser, reasoning   string       // parsers that run ("" none)
	thinking                bool
	wantPromptIDs           bool // the prompt's ids are needed (repetition penalty, return_token_ids)
	spillReason             string
	spillMessage, spillPara string
}

// maxWaveGenerations bounds the generations (n x prompts) of a request
// that has more than the pool's slots and so runs in waves (serveWaves):
// every choice's answer is held until the request ends, and one request
// should not keep a pool busy without end. OpenAI caps n at 128; vLLM sets
// no cap, so the bound is generous and a request past it is spilled (or
// refused, naming n or prompt).
const maxWaveGenerations = 1024

// Spill reasons (label of tilert_router_spilled_total).
const (
	spillFull       = "pool_full"
	spillDown       = "pool_down"
	spillN          = "n"       // n past maxWaveGenerations
	spillBatch      = "prompts" // prompts x n past maxWaveGenerations
	spillBestOf     = "best_of"
	spillEcho       = "echo"
	spillSuffix     = "suffix"
	spillStructured = "response_format"
	spillToolChoice = "tool_choice"
)

// check parses body and decides what the TileRT pool does with it. A
// request the pool cannot serve gets spillReason set (the caller spills it
// to --spill-url, or answers 400 with spillMessage).
func (rt *Router) check(body []byte, chat bool) (*genRequest, *openai.Error) {
	req, e := openai.ParseRequest(body, chat)
	if e != nil {
		return nil, e
	}
	r := &genRequest{Request: req, model: rt.served}
	if req.Model != "" && !rt.knownModel(req.Model) {
		return nil, &openai.Error{Status: http.StatusBadRequest, Type: "invalid_request_error", Param: "model", Code: "model_not_found",
			Message: fmt.Sprintf("field model: %q is not served here; this router serves %q", req.Model, rt.served)}
	}
	for _, id := range req.StopTokenIDs {
		if id < 0 || id >= rt.tok.VocabSize() {
			return nil, openai.BadField("stop_token_ids", "field stop_token_ids: %d is outside the vocabulary [0, %d)", id, rt.tok.VocabSize())
		}
	}
	for id := range req.LogitBias {
		if id >= rt.tok.VocabSize() {
			return nil, openai.BadField("logit_bias", "field logit_bias: token_id %d in logit_bias contains out-of-vocab token id (vocabulary [0, %d))", id, rt.tok.VocabSize())
		}
	}
	// More generations than the pool's slots run in waves (serveWaves), up
	// to maxWaveGenerations a request: past both, the pool does not serve it.
	slots, gens := 0, r.generations()
	if gens > 1 {
		_, slots = rt.gate.busy()
	}
	switch {
	case gens > slots && gens > maxWaveGenerations && len(req.Prompts) > 1:
		r.spill(spillBatch, "prompt", fmt.Sprintf("%d prompts x n=%d is more than the %d generations a request the router serves (in waves on a pool of %d decode slots): send fewer prompts a request",
			len(req.Prompts), req.N, maxWaveGenerations, slots))
	case gens > slots && gens > maxWaveGenerations:
		r.spill(spillN, "n", fmt.Sprintf("n=%d is more than the %d generations a request the router serves (in waves on a pool of %d decode slots): send a smaller n, or separate requests",
			req.N, maxWaveGenerations, slots))
	case req.BestOf > 1:
		r.spill(spillBestOf, "best_of", "only best_of 1 is supported by the TileRT pool")
	case req.Echo:
		r.spill(spillEcho, "echo", "echo is not supported by the TileRT pool")
	case req.Suffix != "":
		r.spill(spillSuffix, "suffix", "suffix is not supported by the TileRT pool")
	case req.ResponseFormat != "" && req.ResponseFormat != "text":
		r.spill(spillStructured, "response_format", "structured output (response_format "+req.ResponseFormat+") is not supported by the TileRT decode pool")
	}
	for _, u := range req.Unmodelled {
		// The spill label is the field's name: vLLM's field list bounds it.
		r.spill(u.Param, u.Param, u.What+" is not supported by the TileRT decode pool (leave the field out, or run the router with --spill-url to send such requests to a vLLM endpoint)")
	}
	if req.ThinkingBudget != nil && rt.thinkEnd == nil {
		return nil, openai.BadField("thinking_token_budget", "field thinking_token_budget: thinking_token_budget is set but the router has no reasoning parser (run it, as vLLM, with --reasoning-parser)")
	}
	r.thinkStart, r.thinkEnd, r.thinkIDs = rt.thinkStart, rt.thinkEnd, rt.thinkIDs
	if len(req.BadWords) > 0 {
		ids, err := badWordsIDs(rt.tok, req.BadWords)
		if err != nil {
			return nil, err
		}
		r.badWords = ids
	}
	if chat && len(req.Tools) > 0 && req.ToolChoice.Mode != openai.ToolChoiceNone {
		switch {
		case rt.opts.ToolCallParser == "":
			r.spill(spillToolChoice, "tool_choice", "tool calls need the router to run with --tool-call-parser (glm47, glm45 or deepseek_v32)")
		case req.ToolChoice.Mode == openai.ToolChoiceAuto && !rt.opts.EnableAutoToolChoice:
			if r.spillReason == "" {
				return nil, openai.BadField("tool_choice", "\"auto\" tool choice requires --enable-auto-tool-choice and --tool-call-parser to be set")
			}
		default:
			r.toolParser = rt.opts.ToolCallParser
		}
	}
	if chat && rt.opts.ReasoningParser != "" {
		r.reasoning = rt.opts.ReasoningParser
		// Thinking from the first token only when the request says the
		// template opened the block (deepseek_v3: chat_template_kwargs
		// thinking, as vLLM's parser; GLM: enable_thinking true); else, as
		// vLLM's glm45/deepseek_r1 parsers, a block the model opens itself
		// with <think> (deepseek_r1 always thinks).
		r.thinking = req.Thinking("thinking", false) || req.Thinking("enable_thinking", false)
	}
	if r.toolParser != "" || r.reasoning != "" {
		// The parsers read the tags (vLLM's parsers turn skip_special_tokens
		// off for the same reason); other special tokens stay skipped.
		r.keepIDs = rt.keepIDs
	}
	r.resolveSampling(rt.defaults)
	r.resolveDefaults(rt.defaults)
	r.wantPromptIDs = req.RepetitionPenalty != 1 || req.ReturnTokenIDs || req.ThinkingBudget != nil
	return r, nil
}

func (r *genRequest) spill(reason, param, msg string) {
	if r.spillReason == "" {
		r.spillReason, r.spillPara, r.spillMessage = reason, param, msg
	}
}

func (r *genRequest) resolveSampling(d samplingDefaults) {
	r.temperature, r.topP, r.topK, r.minP = 1, 1, 0, 0
	if d.Temperature != nil {
		r.temperature = *d.Temperature
	}
	if d.TopP != nil {
		r.topP = *d.TopP
	}
	if d.TopK != nil {
		r.topK = *d.TopK
	}
	if d.MinP != nil {
		r.minP = *d.MinP
	}
	if r.Temperature != nil {
		r.temperature = *r.Temperature
	}
	if r.TopP != nil {
		r.topP = *r.TopP
	}
	if r.TopK != nil {
		r.topK = *r.TopK
	}
	if r.MinP != nil {
		r.minP = *r.MinP
	}
	if r.Seed != nil {
		u := uint64(*r.Seed)
		r.seed = &u
	}
}

// resolveDefaults applies generation_config.json's penalties, max_new_tokens
// (chat without max_tokens) and skip_special_tokens where the client set
// none, as vLLM does; defaulted records them for the prefill body, so that
// a vLLM run with --generation-config vllm samples the first token alike.
func (r *genRequest) resolveDefaults(d samplingDefaults) {
	set := func(k string) bool {
		v, ok := r.Raw[k]
		return ok && string(v) != "null"
	}
	put := func(k string, v any) {
		if r.defaulted == nil {
			r.defaulted = map[string]any{}
		}
		r.defaulted[k] = v
	}
	for _, f := range []struct {
		name string
		def  *float64
		dst  *float64
	}{{"repetition_penalty", d.RepetitionPenalty, &r.RepetitionPenalty}, {"presence_penalty", d.PresencePenalty, &r.PresencePenalty},
		{"frequency_penalty", d.FrequencyPenalty, &r.FrequencyPenalty}} {
		if f.def != nil && !set(f.name) {
			*f.dst = *f.def
			put(f.name, *f.def)
		}
	}
	if d.SkipSpecialTokens != nil && !set("skip_special_tokens") {
		r.SkipSpecial = *d.SkipSpecialTokens
		put("skip_special_tokens", *d.SkipSpecialTokens)
	}
	if d.MaxNewTokens != nil && *d.MaxNewTokens > 0 && r.MaxTokensParam == "" {
		// A default, not the client's: the context caps it (vLLM's
		// get_max_tokens) rather than refusing the request.
		r.MaxTokens = *d.MaxNewTokens
	}
}

// generations is how many the request makes: n for each prompt of its
// batch (one prompt: n); math.MaxInt where that overflows (a huge n).
func (r *genRequest) generations() int {
	p := max(1, len(r.Prompts))
	if r.N > math.MaxInt/p {
		return math.MaxInt
	}
	return p * r.N
}

// child is generation i of the request: choice i % n of prompt i / n, as
// vLLM indexes them; with a seed, choice j is sampled with seed + j, as vLLM
// seeds the n sequences of a prompt.
func (r *genRequest) child(i int) *genRequest {
	c := *r
	if j := i % r.N; r.seed != nil && j > 0 {
		s := *r.seed + uint64(j)
		c.seed = &s
		c.seedSet = true
	}
	if len(r.Prompts) > 1 {
		rq := *r.Request
		rq.Raw = maps.Clone(r.Raw)
		rq.Raw["prompt"] = r.Prompts[i/r.N]
		rq.Prompts = nil
		c.Request = &rq
	}
	return &c
}

// prefillBody is the body sent to vLLM: the client's, with one token to
// generate, no streaming, the first token's id and logprob in the
// logprobs, the resolved sampling, the prompt ids when the decode side
// needs them, and the decode node vLLM's connector ships state to.
func (r *genRequest) prefillBody(model string, n *node, rid string) ([]byte, error) {
	out := make(map[string]any, len(r.Raw)+6)
	for k, v := range r.Raw {
		out[k] = v
	}
	for _, k := range []string{"stream_options", "max_completion_tokens", "stop", "min_tokens"} {
		delete(out, k) // the router applies stop strings to the whole text itself
	}
	out["model"] = model
	out["max_tokens"] = 1
	out["stream"] = false
	if r.MinTokens > 0 {
		out["min_tokens"] = 1 // keeps EOS from being the first token
	}
	if r.Chat {
		out["logprobs"], out["top_logprobs"] = true, 0
		if r.Logprobs {
			out["top_logprobs"] = r.TopLogprobs
		}
		if len(r.Tools) > 0 {
			// vLLM only renders the tools into the prompt; the router owns
			// tool_choice (it parses the model's own format), so vLLM gets
			// "none": no --enable-auto-tool-choice needed there and no
			// guided decoding of the first token.
			out["tool_choice"] = "none"
		}
	} else {
		out["logprobs"] = r.TopLogprobs
	}
	if r.wantPromptIDs {
		out["return_token_ids"] = true
	}
	if _, ok := r.Raw["return_tokens_as_token_ids"]; ok {
		// The first token is read as "token_id:N" (vllm serve
		// --return-tokens-as-token-ids); a client's false would override the
		// server's flag for this request.
		out["return_tokens_as_token_ids"] = true
	}
	for k, v := range r.defaulted {
		out[k] = v
	}
	if r.seedSet {
		out["seed"] = *r.seed
	}
	if r.N > 1 {
		out["n"] = 1 // each choice of n is its own prefill
	}
	out["temperature"], out["top_p"], out["top_k"] = r.temperature, r.topP, r.topK
	if r.minP != 0 {
		out["min_p"] = r.minP // a client's 0 is in the body already
	}
	out["kv_transfer_params"] = map[string]any{"tilert_host": n.host, "tilert_ctrl_port": n.ctrlPort, "tilert_rid": rid}
	return json.Marshal(out)
}

// decodeRequest is the /pd/decode body for rid continuing from first.
func (r *genRequest) decodeRequest(rid string, first int, promptIDs []int) decodeapi.DecodeRequest {
	stream := true
	d := decodeapi.DecodeRequest{RID: rid, FirstTokenID: &first, MaxTokens: r.MaxTokens, StopTokenIDs: r.StopTokenIDs,
		IgnoreEOS: r.IgnoreEOS, Stream: &stream,
		Sampling: &decodeapi.Sampling{Temperature: r.temperature, TopP: r.topP, TopK: r.topK, MinP: r.minP, Seed: r.seed,
			PresencePenalty: r.PresencePenalty, FrequencyPenalty: r.FrequencyPenalty, MinTokens: r.MinTokens,
			BadWordsTokenIDs: r.badWords}}
	if r.RepetitionPenalty != 1 {
		d.Sampling.RepetitionPenalty = r.RepetitionPenalty
		d.PromptTokenIDs = promptIDs
	}
	if r.ThinkingBudget != nil {
		d.Sampling.ThinkingBudget = &decodeapi.ThinkingBudget{Budget: *r.ThinkingBudget, StartIDs: r.thinkStart, EndIDs: r.thinkEnd}
		d.PromptTokenIDs = promptIDs // where the prompt leaves a block
	}
	if len(r.LogitBias) > 0 {
		d.Sampling.LogitBias = make(map[string]float64, len(r.LogitBias))
		for id, b := range r.LogitBias {
			d.Sampling.LogitBias[strconv.Itoa(id)] = b
		}
	}
	if r.Logprobs {
		k := r.TopLogprobs
		d.Logprobs = &k
	}
	return d
}

func retryAfter(d time.Duration) string {
	return strconv.Itoa(max(1, int((d+time.Second-1)/time.Second)))
}

// badWordsIDs is bad_words as the token id sequences the decode node
// blocks (tokenizer.BadWords: vLLM's rule), or a 400 naming the field.
func badWordsIDs(tok *tokenizer.Tokenizer, words []string) ([][]int, *openai.Error) {
	ids, err := tok.BadWords(words, decodeapi.MaxBadWords)
	if err != nil {
		return nil, openai.BadField("bad_words", "field bad_words: %s", err.Error())
	}
	return ids, nil
}
