// Package decodeapi is the HTTP contract between the router and a decode
// node: the paths, the request and response bodies, the NDJSON lines of a
// streamed /pd/decode and the one table that maps error codes to HTTP
// status codes. Both ends import it, so the wire format is spelled once;
// it holds types and pure helpers only, no server or client.
package decodeapi

import (
	"encoding/json"
	"strconv"
	"time"

	"github.com/tilert-go/tilert/pd"
)

// Paths served by a decode node.
const (
	PathDecode       = "/pd/decode"     // POST DecodeRequest -> NDJSON lines or DecodeResponse
	PathCancel       = "/pd/cancel"     // POST CancelRequest -> CancelResponse
	PathHealth       = "/health"        // GET -> Health (503 while draining)
	PathStatus       = "/decode_status" // GET -> Status
	PathCapabilities = "/capabilities"  // GET -> Capabilities
	PathMetrics      = "/metrics"       // GET -> Prometheus text
)

// Addrs are a node's bound addresses, written as JSON to `tilert decode
// --addr-file` (tests and dev tools start nodes on port 0 and read them).
type Addrs struct {
	Ctrl string `json:"ctrl"`
	HTTP string `json:"http"`
}

// ContentTypeNDJSON is the content type of a streamed /pd/decode.
const ContentTypeNDJSON = "application/x-ndjson"

// DecodeRequest is the body of POST /pd/decode.
type DecodeRequest struct {
	RID string `json:"rid"`
	// FirstTokenID is the token prefill sampled (vLLM's max_tokens=1 output).
	FirstTokenID *int `json:"first_token_id"`
	// MaxTokens counts generated tokens including the first one, like the
	// client's max_tokens; absent or 0: only max_seq_len limits.
	MaxTokens    int       `json:"max_tokens"`
	Sampling     *Sampling `json:"sampling,omitempty"`
	StopTokenIDs []int     `json:"stop_token_ids,omitempty"`
	IgnoreEOS    bool      `json:"ignore_eos,omitempty"`
	// TimeoutS bounds the wait for the request's state (default: the
	// node's state_timeout_s).
	TimeoutS *float64 `json:"timeout_s,omitempty"`
	// Stream selects NDJSON lines (default true) or one JSON body.
	Stream *bool `json:"stream,omitempty"`
	// Logprobs, when present, asks for each generated token's logprob
	// (log-softmax of the raw logits, before penalties and temperature, as
	// vLLM's default raw_logprobs) and that many top alternatives (0..20).
	Logprobs *int `json:"logprobs,omitempty"`
	// PromptTokenIDs are the prompt's ids, needed for a repetition penalty
	// (which counts prompt tokens) and a thinking budget (where the prompt
	// leaves a block); the router reads them from vLLM's prefill answer
	// (return_token_ids).
	PromptTokenIDs []int `json:"prompt_token_ids,omitempty"`
}

// Streamed reports whether the answer is NDJSON lines (the default).
func (r *DecodeRequest) Streamed() bool { return r.Stream == nil || *r.Stream }

// Sampling is /pd/decode's sampling block.
type Sampling struct {
	Temperature float64 `json:"temperature"`     // 0: greedy
	TopP        float64 `json:"top_p,omitempty"` // 0 or 1: off
	TopK        int     `json:"top_k,omitempty"` // 0 or -1: off
	// MinP keeps the tokens at least min_p times as likely as the most
	// likely one after temperature, as vLLM's min_p; 0 or absent: off.
	MinP float64 `json:"min_p,omitempty"`
	Seed *uint64 `json:"seed,omitempty"` // absent: random when sampling
	// Penalties as vLLM applies them, after logit_bias and min_tokens and
	// before temperature: presence and frequency count generated tokens
	// (the first one included), repetition counts prompt and generated
	// tokens (logit / rp when positive, * rp when not). 0 or absent: off
	// (repetition: 0 or 1).
	PresencePenalty   float64 `json:"presence_penalty,omitempty"`
	FrequencyPenalty  float64 `json:"frequency_penalty,omitempty"`
	RepetitionPenalty float64 `json:"repetition_penalty,omitempty"`
	// MinTokens keeps stop ids (EOS and stop_token_ids) from being chosen
	// until that many tokens (the first one included) are generated.
	MinTokens int `json:"min_tokens,omitempty"`
	// LogitBias adds to the logits of token ids (keys are ids as strings,
	// as in OpenAI's logit_bias).
	LogitBias map[string]float64 `json:"logit_bias,omitempty"`
	// BadWordsTokenIDs are vLLM's bad_words as token ids (the router
	// tokenises each word with and without a leading space, as vLLM does):
	// a sequence's last id is never chosen where the generated tokens end
	// with the ids before it. At most MaxBadWords sequences.
	BadWordsTokenIDs [][]int `json:"bad_words_token_ids,omitempty"`
	// ThinkingBudget caps a thinking block's tokens (vLLM's
	// thinking_token_budget; the router resolves the reasoning parser's
	// tags and where the prompt left off).
	ThinkingBudget *ThinkingBudget `json:"thinking_budget,omitempty"`
}

// ThinkingBudget lets a thinking block (start_ids ... end_ids) hold budget
// tokens, then forces end_ids. The node reads from prompt_token_ids
// (required with it) whether the prompt leaves a block open.
type ThinkingBudget struct {
	Budget   int   `json:"budget"`
	StartIDs []int `json:"start_ids"`
	EndIDs   []int `json:"end_ids"`
}

// MaxBadWords is vLLM's default VLLM_MAX_NUM_BAD_WORDS: the most token
// sequences a request's bad_words may become.
const MaxBadWords = 128

// Finish reasons of a FinalLine.
const (
	FinishStop      = "stop"      // a stop id was generated
	FinishLength    = "length"    // max_tokens or max_seq_len reached
	FinishCancelled = "cancelled" // /pd/cancel, the client left, or the node is draining
	FinishError     = "error"     // the engine failed; Error and Message say how
)

// TokensLine is one streamed NDJSON line of token ids, with their
// logprobs when the request asked for them (LP[i] belongs to T[i]).
type TokensLine struct {
	T  []int          `json:"t"`
	LP []TokenLogprob `json:"lp,omitempty"`
}

// TokenLogprob is one generated token's logprob and its top alternatives
// (most likely first).
type TokenLogprob struct {
	P   float64      `json:"p"`
	Top []TopLogprob `json:"top,omitempty"`
}

// TopLogprob is one alternative token.
type TopLogprob struct {
	ID int     `json:"id"`
	P  float64 `json:"p"`
}

// FinalLine is the last NDJSON line of a stream (or the stream=false
// body's tail). Done is false only when the request failed; then Error
// holds a code and Message the cause.
type FinalLine struct {
	Done          bool               `json:"done,omitempty"`
	N             int                `json:"n"`
	FinishReason  string             `json:"finish_reason"`
	TimingMS      map[string]float64 `json:"timing_ms"`
	MTPAcceptMean float64            `json:"mtp_accept_mean"`
	Error         string             `json:"error,omitempty"`
	Message       string             `json:"message,omitempty"`
}

// Line is any streamed line as a reader decodes it: tokens, or the final
// line (Done or Error set).
type Line struct {
	T  []int          `json:"t"`
	LP []TokenLogprob `json:"lp,omitempty"`
	FinalLine
}

// Final reports whether l ends the stream.
func (l *Line) Final() bool { return l.Done || l.Error != "" }

// ParseLine decodes one NDJSON line.
func ParseLine(b []byte) (Line, error) {
	var l Line
	err := json.Unmarshal(b, &l)
	return l, err
}

// DecodeResponse is the stream=false body; streamed, the same fields but
// "t" form the final line.
type DecodeResponse struct {
	RID string         `json:"rid"`
	T   []int          `json:"t"`
	LP  []TokenLogprob `json:"lp,omitempty"`
	FinalLine
}

// CancelRequest is the body of POST /pd/cancel.
type CancelRequest struct {
	RID string `json:"rid"`
}

// Cancel states: where the request was when the cancel arrived.
const (
	CancelUnknown  = "unknown" // no live request; admits for the rid are refused for a while all the same
	CancelWaiting  = "waiting" // waiting for its state
	CancelDecoding = "decoding"
)

// CancelResponse answers POST /pd/cancel.
type CancelResponse struct {
	RID       string `json:"rid"`
	Cancelled bool   `json:"cancelled"`
	State     string `json:"state"`
}

// Health is the /health body: Status "ok" (200) or "draining" (503, no
// slot counts).
type Health struct {
	Status string `json:"status"`
	Slots  *int   `json:"slots,omitempty"`
	Busy   *int   `json:"busy,omitempty"`
}

// SlotStatus is one slot in /decode_status.
type SlotStatus struct {
	pd.SlotInfo
	Tokens int `json:"tokens,omitempty"` // generated so far, while decoding
}

// Request states in /decode_status.
const (
	RequestWaitingState = "waiting_state"
	RequestDecoding     = "decoding"
)

// RequestStatus is one live /pd/decode in /decode_status.
type RequestStatus struct {
	RID    string  `json:"rid"`
	State  string  `json:"state"` // RequestWaitingState | RequestDecoding
	Slot   *int    `json:"slot,omitempty"`
	Tokens int     `json:"tokens"`
	AgeMS  float64 `json:"age_ms"`
}

// Status is the /decode_status body.
type Status struct {
	MaxInflight int             `json:"max_inflight"`
	Busy        int             `json:"busy"`
	Draining    bool            `json:"draining"`
	Slots       []SlotStatus    `json:"slots"`
	Requests    []RequestStatus `json:"requests"`
	MaxBatch    int             `json:"max_batch"`
}

// Capabilities is the /capabilities body.
type Capabilities struct {
	Model         string         `json:"model"`
	Engine        string         `json:"engine"`
	LayoutVersion int            `json:"layout_version"`
	Layout        string         `json:"layout"`
	KVCacheDType  string         `json:"kv_cache_dtype"`
	NumLayers     int            `json:"num_layers"`
	MaxSeqLen     int            `json:"max_seq_len"`
	MaxInflight   int            `json:"max_inflight"`
	MTP           bool           `json:"mtp"`
	VocabSize     int            `json:"vocab_size"`
	EOS           []int          `json:"eos_token_ids"`
	Protocol      int            `json:"protocol_version"`
	Transport     pd.Transport   `json:"transport"`
	Regions       []pd.RegionCap `json:"regions"`
	// Device is "cuda" or "cpu"; Devices the GPU ordinal of each
	// tensor-parallel rank (absent: one GPU, or the CPU).
	Device  string `json:"device,omitempty"`
	Devices []int  `json:"devices,omitempty"`
}

// ErrorBody is every error answer's body (and Retry-After header).
type ErrorBody struct {
	Error        Code   `json:"error"`
	Message      string `json:"message"`
	RetryAfterMS int64  `json:"retry_after_ms,omitempty"`
}

// Code names an error; Status maps it to its HTTP status.
type Code string

// Error codes a decode node answers with.
const (
	CodeBadRequest        Code = "bad_request"
	CodeUnauthorized      Code = "unauthorized"     // /pd/* without the router's bearer token
	CodeTimeout           Code = "request_timeout"  // the request did not arrive within security.read_timeout_s
	CodeTooLarge          Code = "too_large"        // body past security.max_body_bytes
	CodeHeaderTooLarge    Code = "header_too_large" // headers past security.max_header_bytes
	CodeNotFound          Code = "not_found"
	CodeMethodNotAllowed  Code = "method_not_allowed"
	CodeDuplicateRID      Code = "duplicate_rid"
	CodeBusy              Code = "busy"
	CodeShuttingDown      Code = "shutting_down"
	CodeKVTransferTimeout Code = "kv_transfer_timeout"
	CodeImportFailed      Code = "import_failed"
	CodeInternal          Code = "internal"
	// CodeEngineError appears only in a FinalLine: the stream had begun.
	CodeEngineError Code = "engine_error"
)

// statusOf is the one table from error code to HTTP status.
var statusOf = map[Code]int{
	CodeBadRequest:        400,
	CodeUnauthorized:      401,
	CodeTimeout:           408,
	CodeTooLarge:          413,
	CodeHeaderTooLarge:    431,
	CodeNotFound:          404,
	CodeMethodNotAllowed:  405,
	CodeDuplicateRID:      409,
	CodeBusy:              429,
	CodeShuttingDown:      503,
	CodeKVTransferTimeout: 504,
	CodeImportFailed:      500,
	CodeInternal:          500,
	CodeEngineError:       500,
}

// Status is c's HTTP status (500 for a code the table lacks).
func (c Code) Status() int {
	if s, ok := statusOf[c]; ok {
		return s
	}
	return 500
}

// CodeOf maps an HTTP status back to the code a node answers it with, for
// a reader whose body was unreadable; ok is false for a status the table
// does not hold, and for 500, which several codes share.
func CodeOf(status int) (c Code, ok bool) {
	for code, s := range statusOf {
		if s == status && s != 500 {
			return code, true
		}
	}
	return "", false
}

// Error is a refused request: its code, message and, for busy, how long to
// wait before retrying.
type Error struct {
	Code       Code
	Message    string
	RetryAfter time.Duration
}

func (e *Error) Error() string { return string(e.Code) + ": " + e.Message }

// Status is e's HTTP status.
func (e *Error) Status() int { return e.Code.Status() }

// Body is e's wire form.
func (e *Error) Body() ErrorBody {
	return ErrorBody{Error: e.Code, Message: e.Message, RetryAfterMS: e.RetryAfter.Milliseconds()}
}

// RetryAfterHeader is the Retry-After value (whole seconds, at least 1),
// or "" when e carries no retry hint.
func (e *Error) RetryAfterHeader() string {
	if e.RetryAfter <= 0 {
		return ""
	}
	return strconv.Itoa(max(1, int((e.RetryAfter+time.Second-1)/time.Second)))
}

// ParseError reads an error answer: its body when it is an ErrorBody, else
// the code the status maps to with the body as message.
func ParseError(status int, body []byte) *Error {
	var b ErrorBody
	if json.Unmarshal(body, &b) == nil && b.Error != "" {
		return &Error{Code: b.Error, Message: b.Message, RetryAfter: time.Duration(b.RetryAfterMS) * time.Millisecond}
	}
	c, ok := CodeOf(status)
	if !ok {
		c = CodeInternal
	}
	return &Error{Code: c, Message: string(body)}
}
