// Package openai holds the OpenAI API shapes the router speaks (requests,
// responses, stream chunks, errors) as typed structs, and pure functions
// that check requests and build responses, as vLLM's OpenAI server answers
// them. It knows nothing of HTTP servers, the TileRT pool or the decode
// protocol: the router converts between those and these types.
package openai

import (
	"encoding/json"
	"time"
)

// Error is an OpenAI-style error with the HTTP status it is answered with.
type Error struct {
	Status  int
	Type    string
	Code    string
	Param   string
	Message string
	// RetryAfter, when > 0, is sent as the Retry-After header (whole seconds).
	RetryAfter time.Duration
}

func (e *Error) Error() string { return e.Message }

// ErrorResponse is the body of an error: {"error":{...}}.
type ErrorResponse struct {
	Error ErrorBody `json:"error"`
}

// ErrorBody is OpenAI's error object; param and code are null when unset.
type ErrorBody struct {
	Message string  `json:"message"`
	Type    string  `json:"type"`
	Param   *string `json:"param"`
	Code    *string `json:"code"`
}

// Body is e as the JSON error object clients parse.
func (e *Error) Body() ErrorResponse {
	b := ErrorBody{Message: e.Message, Type: e.Type}
	if e.Param != "" {
		b.Param = &e.Param
	}
	if e.Code != "" {
		b.Code = &e.Code
	}
	return ErrorResponse{Error: b}
}

// Usage counts tokens of one request.
type Usage struct {
	PromptTokens     int `json:"prompt_tokens"`
	CompletionTokens int `json:"completion_tokens"`
	TotalTokens      int `json:"total_tokens"`
	// CompletionTokensDetails: chat answers of a server with a reasoning
	// parser (vLLM sets it then, and only then).
	CompletionTokensDetails *CompletionTokensDetails `json:"completion_tokens_details,omitempty"`
}

// CompletionTokensDetails breaks the completion tokens down.
type CompletionTokensDetails struct {
	ReasoningTokens int `json:"reasoning_tokens"`
}

// NewUsage fills TotalTokens.
func NewUsage(prompt, completion int) Usage {
	return Usage{PromptTokens: prompt, CompletionTokens: completion, TotalTokens: prompt + completion}
}

// Message is one chat message of a request.
type Message struct {
	Role       string          `json:"role"`
	Content    json.RawMessage `json:"content,omitempty"`
	Name       string          `json:"name,omitempty"`
	ToolCalls  []ToolCall      `json:"tool_calls,omitempty"`
	ToolCallID string          `json:"tool_call_id,omitempty"`
	// ReasoningContent is accepted on assistant turns (vLLM does).
	ReasoningContent *string `json:"reasoning_content,omitempty"`
}

// Tool is one entry of a request's tools.
type Tool struct {
	Type     string   `json:"type"`
	Function Function `json:"function"`
}

// Function describes a callable function; Parameters is a JSON schema.
type Function struct {
	Name        string          `json:"name"`
	Description string          `json:"description,omitempty"`
	Parameters  json.RawMessage `json:"parameters,omitempty"`
	Strict      *bool           `json:"strict,omitempty"`
}

// ToolChoice is a request's tool_choice: "none", "auto", "required", or a
// named function (Mode "named", Name set).
type ToolChoice struct {
	Mode string
	Name string
}

// Tool choice modes.
const (
	ToolChoiceNone     = "none"
	ToolChoiceAuto     = "auto"
	ToolChoiceRequired = "required"
	ToolChoiceNamed    = "named"
)

// ToolCall is a parsed call in a response message.
type ToolCall struct {
	ID       string       `json:"id"`
	Type     string       `json:"type"`
	Function FunctionCall `json:"function"`
}

// FunctionCall is a called function's name and its arguments as a JSON
// object in a string.
type FunctionCall struct {
	Name      string `json:"name"`
	Arguments string `json:"arguments"`
}

// ToolCallDelta is a streamed piece of a tool call: the first carries id,
// type and name, the later ones argument fragments.
type ToolCallDelta struct {
	Index    int           `json:"index"`
	ID       string        `json:"id,omitempty"`
	Type     string        `json:"type,omitempty"`
	Function FunctionDelta `json:"function"`
}

// FunctionDelta is the function part of a ToolCallDelta.
type FunctionDelta struct {
	Name      string `json:"name,omitempty"`
	Arguments string `json:"arguments"`
}

// TopLogprob is one alternative token.
type TopLogprob struct {
	Token   string  `json:"token"`
	Logprob float64 `json:"logprob"`
	Bytes   []int   `json:"bytes"`
}

// TokenLogprob is one emitted token's log-probability and the top
// alternatives (chat completions).
type TokenLogprob struct {
	Token       string       `json:"token"`
	Logprob     float64      `json:"logprob"`
	Bytes       []int        `json:"bytes"`
	TopLogprobs []TopLogprob `json:"top_logprobs"`
}

// ChatLogprobs is a chat choice's logprobs.
type ChatLogprobs struct {
	Content []TokenLogprob `json:"content"`
}

// CompletionLogprobs is a completion choice's logprobs (legacy shape).
type CompletionLogprobs struct {
	Tokens        []string             `json:"tokens"`
	TokenLogprobs []float64            `json:"token_logprobs"`
	TopLogprobs   []map[string]float64 `json:"top_logprobs"`
	TextOffset    []int                `json:"text_offset"`
}

// ResponseMessage is a chat choice's message.
type ResponseMessage struct {
	Role             string     `json:"role"`
	Content          *string    `json:"content"`
	ReasoningContent *string    `json:"reasoning_content,omitempty"`
	ToolCalls        []ToolCall `json:"tool_calls"`
}

// ChatChoice is a choice of a chat completion.
type ChatChoice struct {
	Index        int             `json:"index"`
	Message      ResponseMessage `json:"message"`
	Logprobs     *ChatLogprobs   `json:"logprobs"`
	FinishReason string          `json:"finish_reason"`
	TokenIDs     []int           `json:"token_ids,omitempty"` // return_token_ids
}

// ChatCompletion is a non-streamed chat answer.
type ChatCompletion struct {
	ID      string       `json:"id"`
	Object  string       `json:"object"`
	Created int64        `json:"created"`
	Model   string       `json:"model"`
	Choices []ChatChoice `json:"choices"`
	Usage   *Usage       `json:"usage,omitempty"`
	// PromptTokenIDs are the prompt's ids (return_token_ids).
	PromptTokenIDs []int `json:"prompt_token_ids,omitempty"`
	// PromptLogprobs are vLLM's, relayed (prompt_logprobs).
	PromptLogprobs json.RawMessage `json:"prompt_logprobs,omitempty"`
	// PromptText is the rendered prompt (return_prompt_text).
	PromptText *string `json:"prompt_text,omitempty"`
}

// Delta is a streamed chat choice's increment.
type Delta struct {
	Role             string          `json:"role,omitempty"`
	Content          *string         `json:"content,omitempty"`
	ReasoningContent *string         `json:"reasoning_content,omitempty"`
	ToolCalls        []ToolCallDelta `json:"tool_calls,omitempty"`
}

// ChunkChoice is a choice of a chat stream chunk.
type ChunkChoice struct {
	Index        int           `json:"index"`
	Delta        Delta         `json:"delta"`
	Logprobs     *ChatLogprobs `json:"logprobs"`
	FinishReason *string       `json:"finish_reason"`
	TokenIDs     []int         `json:"token_ids,omitempty"` // the chunk's tokens (return_token_ids)
}

// ChatCompletionChunk is one SSE event of a streamed chat answer.
type ChatCompletionChunk struct {
	ID      string        `json:"id"`
	Object  string        `json:"object"`
	Created int64         `json:"created"`
	Model   string        `json:"model"`
	Choices []ChunkChoice `json:"choices"`
	Usage   *Usage        `json:"usage,omitempty"`
	// PromptTokenIDs, on the first chunk only (return_token_ids).
	PromptTokenIDs []int `json:"prompt_token_ids,omitempty"`
	// PromptText, on the first chunk only (return_prompt_text).
	PromptText *string `json:"prompt_text,omitempty"`
}

// CompletionChoice is a choice of a text completion (streamed or not).
type CompletionChoice struct {
	Index        int                 `json:"index"`
	Text         string              `json:"text"`
	Logprobs     *CompletionLogprobs `json:"logprobs"`
	FinishReason *string             `json:"finish_reason"`
	// With return_token_ids: the prompt's ids (a stream's first chunk only)
	// and the generated ids (a stream's: the chunk's).
	PromptTokenIDs []int `json:"prompt_token_ids,omitempty"`
	TokenIDs       []int `json:"token_ids,omitempty"`
	// PromptLogprobs are vLLM's, relayed (prompt_logprobs; not streamed).
	PromptLogprobs json.RawMessage `json:"prompt_logprobs,omitempty"`
}

// Completion is a text completion or one event of a streamed one.
type Completion struct {
	ID      string             `json:"id"`
	Object  string             `json:"object"`
	Created int64              `json:"created"`
	Model   string             `json:"model"`
	Choices []CompletionChoice `json:"choices"`
	Usage   *Usage             `json:"usage,omitempty"`
}

// Model is an entry of /v1/models.
type Model struct {
	ID          string `json:"id"`
	Object      string `json:"object"`
	Created     int64  `json:"created"`
	OwnedBy     string `json:"owned_by"`
	Root        string `json:"root,omitempty"`
	MaxModelLen int    `json:"max_model_len,omitempty"`
}

// ModelList is the body of /v1/models.
type ModelList struct {
	Object string  `json:"object"`
	Data   []Model `json:"data"`
}

// Object names.
const (
	ObjectChat       = "chat.completion"
	ObjectChatChunk  = "chat.completion.chunk"
	ObjectCompletion = "text_completion"
)
