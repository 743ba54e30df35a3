package openai

import (
	"bytes"
	"encoding/json"
	"sort"
)

// FieldUse says what a request field of vLLM's OpenAI server does to an
// answer, as far as a server that forwards the prompt to vLLM and decodes
// elsewhere is concerned.
type FieldUse uint8

const (
	// FieldModelled fields are read by ParseRequest into Request.
	FieldModelled FieldUse = iota + 1
	// FieldPrompt fields are read by vLLM's prefill alone: how the prompt
	// is rendered, tokenised, cached or scheduled. A router forwards them.
	FieldPrompt
	// FieldNoEffect fields change nothing in an answer of these endpoints
	// (vLLM ignores them, or they only apply to other endpoints or to
	// options a server turns on).
	FieldNoEffect
	// FieldOther fields change the answer in a way Request does not model:
	// set to anything but their default, they are listed in
	// Request.Unmodelled so that the caller refuses or redirects the
	// request rather than silently answering something else.
	FieldOther
)

type fieldInfo struct {
	use        FieldUse
	chat, comp bool // accepted by /v1/chat/completions, /v1/completions
	// what the field asks for, for the error naming it (FieldOther)
	what string
}

// vllmFields are the request fields of vLLM 0.33.0's ChatCompletionRequest
// and CompletionRequest (python/tests/test_vllm_fields.py checks this list
// against the installed vLLM's models; testdata/vllm-fields.json is the
// list both sides read).
var vllmFields = map[string]fieldInfo{
	// Modelled.
	"model":                      {FieldModelled, true, true, ""},
	"messages":                   {FieldModelled, true, false, ""},
	"prompt":                     {FieldModelled, false, true, ""},
	"stream":                     {FieldModelled, true, true, ""},
	"stream_options":             {FieldModelled, true, true, ""},
	"max_tokens":                 {FieldModelled, true, true, ""},
	"max_completion_tokens":      {FieldModelled, true, false, ""},
	"stop":                       {FieldModelled, true, true, ""},
	"stop_token_ids":             {FieldModelled, true, true, ""},
	"ignore_eos":                 {FieldModelled, true, true, ""},
	"skip_special_tokens":        {FieldModelled, true, true, ""},
	"include_stop_str_in_output": {FieldModelled, true, true, ""},
	"min_tokens":                 {FieldModelled, true, true, ""},
	"temperature":                {FieldModelled, true, true, ""},
	"top_p":                      {FieldModelled, true, true, ""},
	"top_k":                      {FieldModelled, true, true, ""},
	"min_p":                      {FieldModelled, true, true, ""},
	"seed":                       {FieldModelled, true, true, ""},
	"presence_penalty":           {FieldModelled, true, true, ""},
	"frequency_penalty":          {FieldModelled, true, true, ""},
	"repetition_penalty":         {FieldModelled, true, true, ""},
	"logit_bias":                 {FieldModelled, true, true, ""},
	"bad_words":                  {FieldModelled, true, true, ""},
	"thinking_token_budget":      {FieldModelled, true, true, ""},
	"repetition_detection":       {FieldModelled, true, true, ""},
	"prompt_logprobs":            {FieldModelled, true, true, ""},
	"return_prompt_text":         {FieldModelled, true, false, ""},
	"logprobs":                   {FieldModelled, true, true, ""},
	"return_tokens_as_token_ids": {FieldModelled, true, true, ""},
	"return_token_ids":           {FieldModelled, true, true, ""},
	"top_logprobs":               {FieldModelled, true, false, ""},
	"tools":                      {FieldModelled, true, false, ""},
	"tool_choice":                {FieldModelled, true, false, ""},
	"parallel_tool_calls":        {FieldModelled, true, false, ""},
	"include_reasoning":          {FieldModelled, true, false, ""},
	"chat_template_kwargs":       {FieldModelled, true, false, ""},
	"n":                          {FieldModelled, true, true, ""},
	"echo":                       {FieldModelled, true, true, ""},
	"suffix":                     {FieldModelled, false, true, ""},
	"response_format":            {FieldModelled, true, true, ""},

	// Read by vLLM's prefill only.
	"add_special_tokens":     {FieldPrompt, true, true, ""},
	"add_generation_prompt":  {FieldPrompt, true, false, ""},
	"continue_final_message": {FieldPrompt, true, false, ""},
	"chat_template":          {FieldPrompt, true, false, ""},
	"documents":              {FieldPrompt, true, false, ""},
	"reasoning_effort":       {FieldPrompt, true, false, ""},
	"mm_processor_kwargs":    {FieldPrompt, true, false, ""},
	"media_io_kwargs":        {FieldPrompt, true, false, ""},
	"truncate_prompt_tokens": {FieldPrompt, true, true, ""},
	"truncation_side":        {FieldPrompt, true, true, ""},
	"cache_salt":             {FieldPrompt, true, true, ""},
	"priority":               {FieldPrompt, true, true, ""},
	"ec_transfer_params":     {FieldPrompt, true, true, ""},

	// No effect on these endpoints' answers.
	"user":                          {FieldNoEffect, true, true, ""}, // vLLM ignores it
	"request_id":                    {FieldNoEffect, true, true, ""}, // vLLM's internal id; the router makes its own
	"session_id":                    {FieldNoEffect, true, true, ""},
	"kv_transfer_params":            {FieldNoEffect, true, true, ""}, // a P/D router replaces it with its own
	"length_penalty":                {FieldNoEffect, true, true, ""}, // beam search only, which is refused
	"stream_interval":               {FieldNoEffect, true, true, ""}, // a batching hint: every token is its own chunk here
	"spaces_between_special_tokens": {FieldNoEffect, true, true, ""},
	"routed_experts_prompt_start":   {FieldNoEffect, true, true, ""}, // routed-expert data is a server option
	"return_token_offsets":          {FieldNoEffect, true, true, ""}, // render endpoints only
	"mm_payload":                    {FieldNoEffect, true, true, ""}, // render endpoints only
	"return_mm_kwargs":              {FieldNoEffect, true, true, ""}, // render endpoints only

	// Changes the answer in ways Request does not model.
	"allowed_token_ids":      {FieldOther, true, true, "sampling restricted to allowed_token_ids"},
	"structured_outputs":     {FieldOther, true, true, "structured output (guided decoding)"},
	"use_beam_search":        {FieldOther, true, true, "beam search"},
	"logprob_token_ids":      {FieldOther, true, true, "logprobs of chosen token ids"},
	"watermarking":           {FieldOther, true, true, "watermarked sampling"},
	"return_weight_versions": {FieldOther, true, true, "weight versions in the answer"},
	"vllm_xargs":             {FieldOther, true, true, "custom logits processors' arguments (vllm_xargs)"},
	"prompt_embeds":          {FieldOther, false, true, "prompt embeddings"},
}

// VLLMField reports what field does on the chat (or completions) endpoint
// of vLLM 0.33.0; false when vLLM does not accept it there (vLLM ignores
// such fields with a warning).
func VLLMField(name string, chat bool) (FieldUse, bool) {
	f, ok := vllmFields[name]
	if !ok || (chat && !f.chat) || (!chat && !f.comp) {
		return 0, false
	}
	return f.use, true
}

// VLLMFieldNames lists every field of vllmFields accepted on the chat (or
// completions) endpoint, sorted.
func VLLMFieldNames(chat bool) []string {
	var out []string
	for name := range vllmFields {
		if _, ok := VLLMField(name, chat); ok {
			out = append(out, name)
		}
	}
	sort.Strings(out)
	return out
}

// Unmodelled is one FieldOther field a request set.
type Unmodelled struct {
	Param, What string
}

// unmodelled lists the FieldOther fields f sets to other than their
// default, sorted by name.
func unmodelled(f fields, chat bool) []Unmodelled {
	var out []Unmodelled
	for name, v := range f {
		if use, ok := VLLMField(name, chat); !ok || use != FieldOther || unset(name, v) {
			continue
		}
		out = append(out, Unmodelled{Param: name, What: vllmFields[name].what})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Param < out[j].Param })
	return out
}

// unset reports whether v is a field's default: null, false, 0, "", [] or
// {} (a thinking_token_budget of -1 is vLLM's "unlimited").
func unset(name string, v json.RawMessage) bool {
	v = bytes.TrimSpace(v)
	switch string(v) {
	case "null", "false", "0", `""`, "[]", "{}":
		return true
	}
	if name == "thinking_token_budget" && string(v) == "-1" {
		return true
	}
	var x any
	if json.Unmarshal(v, &x) != nil {
		return false
	}
	switch t := x.(type) {
	case []any:
		return len(t) == 0
	case map[string]any:
		return len(t) == 0
	case float64:
		return t == 0
	}
	return false
}
