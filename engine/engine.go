// Package engine defines the decode engine interface shared by the CPU
// reference backend (engine/cpu) and the GPU backend, the byte layouts of the
// per-request state that crosses from vLLM prefill (vLLM's own cache layouts,
// block size 64), and token sampling.
//
// The interface is free of HTTP and transport concerns: the decode node owns
// admission, transfers and streaming, and drives an Engine through slots.
//
// Slot life cycle:
//
//	Free --Prefill/Import--> Loaded --Start--> Active --Step...--> Finished --Release--> Free
//
// A Loaded slot holds the caches of positions 0..SeqLen-1 for every layer
// (main layers and the MTP layer) and nothing else; the first generated token
// (sampled by whoever ran the prefill) is handed to Start, and every Step
// forwards the pending token(s) of each listed slot once, in one batch.
package engine

import (
	"github.com/cockroachdb/errors"
)

// Mode selects the numeric mode of an engine.
type Mode string

const (
	// ModeExact keeps float32 caches; it matches HF transformers to ~1e-6.
	ModeExact Mode = "exact"
	// ModeServing keeps each slot's caches as bytes in vLLM's layouts (see
	// layout.go), so a state shipped from vLLM is used as is.
	ModeServing Mode = "serving"
)

// ParseMode accepts "exact" or "serving".
func ParseMode(s string) (Mode, error) {
	switch Mode(s) {
	case ModeExact, ModeServing:
		return Mode(s), nil
	}
	return "", errors.WithHint(errors.Newf("unknown engine mode %q", s), "use exact or serving")
}

// Options configures an engine.
type Options struct {
	Mode Mode
	// MLACache is the MLA cache layout of the state that crosses (and, in
	// serving mode, of the live cache): CacheFP8DSMLA (default) or CacheBF16.
	MLACache CacheDType
	// Slots is the number of concurrently decoded sequences (--max-inflight).
	Slots int
	// MaxSeqLen bounds prompt + generated tokens per slot (rounded up to a
	// whole number of 64-token pages).
	MaxSeqLen int
	// MTP enables speculative decoding with the model's MTP layer (one
	// drafted token per step, verified in the next step's forward).
	MTP bool
	// Prefill is the arithmetic of prompt chunks (PrefillFloat32 or
	// PrefillFast); decode steps are float32 either way.
	Prefill PrefillPrecision
}

// PrefillPrecision is how a prompt chunk's products are rounded.
type PrefillPrecision string

const (
	// PrefillFloat32 (the default, also ""): products float32-exact, so a
	// GPU prefill leaves the CPU engine's caches and greedy tokens.
	PrefillFloat32 PrefillPrecision = "float32"
	// PrefillFast rounds x once to fp16 per GEMM and the MLA operands once,
	// as HF's and vLLM's bf16 prefill do: ~3.5x faster on the GPU (an
	// 8192-token prefill 119.5 against ~430 ms on the H200), serving mode
	// only; tokens can leave the float32 prefill's after a long prompt.
	// The CPU engine prefills in float32 whatever this says.
	PrefillFast PrefillPrecision = "fast"
)

// ParsePrefillPrecision accepts float32 (or empty) and fast.
func ParsePrefillPrecision(s string) (PrefillPrecision, error) {
	switch PrefillPrecision(s) {
	case "", PrefillFloat32:
		return PrefillFloat32, nil
	case PrefillFast:
		return PrefillFast, nil
	}
	return "", errors.WithHint(errors.Newf("unknown prefill precision %q", s),
		"use float32 (products exact, the default) or fast (x rounded once to fp16, as a bf16 prefill; GPU, serving mode)")
}

// Params are per-request sampling and stopping rules.
type Params struct {
	// Temperature <= 0 selects greedy (argmax) decoding.
	Temperature float64
	TopP        float64 // 0 or >= 1: disabled
	TopK        int     // <= 0: disabled
	// MinP keeps the tokens whose probability (after temperature) is at
	// least MinP times the most likely one's, as vLLM's min_p; 0: disabled.
	MinP float64
	Seed uint64 // random stream; sample at position p uses (Seed, p)
	// StopIDs end the sequence when generated (the stop token is emitted).
	StopIDs []int
	// MaxTokens caps the number of generated tokens including the first one
	// handed to Start; <= 0 means only MaxSeqLen limits.
	MaxTokens int

	// Logit adjustments, as vLLM applies them (see penalty.go): 0 (or 1
	// for RepetitionPenalty) is off.
	PresencePenalty   float64
	FrequencyPenalty  float64
	RepetitionPenalty float64
	MinTokens         int // stop ids are blocked until this many are generated
	LogitBias         map[int]float32
	// BadWords are token id sequences that must not be generated (vLLM's
	// bad_words after tokenisation): the last id of a sequence is blocked
	// wherever the generated tokens end with the ids before it.
	BadWords [][]int
	// Think caps the tokens of a thinking block (vLLM's
	// thinking_token_budget); nil: no cap.
	Think *ThinkBudget
	// PromptIDs are the prompt's ids, read by the repetition penalty.
	PromptIDs []int
	// Logprobs asks for each generated token's logprob and TopLogprobs
	// alternatives.
	Logprobs    bool
	TopLogprobs int
}

// Greedy reports whether p selects argmax decoding.
func (p Params) Greedy() bool { return p.Temperature <= 0 }

// FinishReason says why a slot stopped.
type FinishReason string

const (
	FinishNone   FinishReason = ""
	FinishStop   FinishReason = "stop"   // a stop id was generated
	FinishLength FinishReason = "length" // MaxTokens or MaxSeqLen reached
)

// StepResult is one slot's outcome of a Step.
type StepResult struct {
	Slot   int
	Tokens []int // newly generated tokens, in order (1, or 2 with an accepted draft)
	// Logprobs[i] belongs to Tokens[i], when the slot's Params ask for them.
	Logprobs []TokenLogprobs
	Finish   FinishReason // non-empty once the slot has finished
	// Drafted/Accepted count MTP draft tokens verified in this step.
	Drafted, Accepted int
}

// SlotMeta is the metadata that travels with a slot's cache bytes.
type SlotMeta struct {
	// SeqLen is the number of positions whose caches are present (the prompt
	// length after a prefill).
	SeqLen int
	// MTPLen is the number of MTP-layer cache positions present: SeqLen when
	// the prefill ran the MTP layer on the sampled first token (vLLM's drafter
	// does), SeqLen-1 when it did not; the engine then recomputes the last one.
	MTPLen int
	// LastToken is the token at position SeqLen-1 (the last prompt token).
	LastToken int
}

// Segment is a run of bytes at Offset inside a slot buffer (see Layout).
type Segment struct {
	Offset int64
	Data   []byte
}

// Stats are cumulative engine counters.
type Stats struct {
	Steps          int64 // Step calls
	Tokens         int64 // tokens generated by Step
	Forwarded      int64 // positions forwarded through the main model (prefill + decode)
	DraftTokens    int64 // MTP tokens drafted and verified
	AcceptedTokens int64 // of those, accepted
}

// AcceptRate is AcceptedTokens / DraftTokens (0 when nothing was drafted).
func (s Stats) AcceptRate() float64 {
	if s.DraftTokens == 0 {
		return 0
	}
	return float64(s.AcceptedTokens) / float64(s.DraftTokens)
}

// Engine is a decode backend. Methods are not safe for concurrent use; the
// decode node serialises calls (one goroutine owns the engine).
type Engine interface {
	Options() Options
	// Layout describes the byte layout of one slot's state.
	Layout() Layout
	// Prefill runs prompt through the model into slot (which must be free),
	// including the MTP layer over the whole prompt, and samples the first
	// token with p (at position len(prompt)). The slot is then Loaded with
	// the same state vLLM would ship; pass the returned token to Start.
	Prefill(slot int, prompt []int, p Params) (first int, err error)
	// Import loads state into a free slot. segs are copied to their offsets
	// in the slot buffer first; with segs == nil the bytes are taken to be in
	// SlotBuffer(slot) already (written there by a transfer engine). In
	// serving mode the slot buffer is the live cache, so this is a hand-over.
	Import(slot int, meta SlotMeta, segs []Segment) error
	// Export returns the slot's state as the used pages of every layer's
	// regions (copies), for a Loaded or Active slot.
	Export(slot int) (SlotMeta, []Segment, error)
	// SlotBuffer is the slot's receive buffer (Layout().SlotBytes bytes).
	// The caller may write into it only while the slot is free.
	SlotBuffer(slot int) ([]byte, error)
	// Start begins decoding a Loaded slot from its first generated token.
	// It returns FinishStop/FinishLength if first already ends the request.
	Start(slot int, first int, p Params) (FinishReason, error)
	// Step forwards every listed Active slot once, in one batch.
	Step(slots []int) ([]StepResult, error)
	// Release frees a slot in any state.
	Release(slot int)
	Stats() Stats
	Close() error
}

// Errors callers can test for with errors.Is.
var (
	ErrSlotBusy   = errors.New("slot busy")
	ErrSlotState  = errors.New("slot in wrong state")
	ErrTooLong    = errors.New("sequence too long")
	ErrBadSlot    = errors.New("no such slot")
	ErrBadLayout  = errors.New("state layout mismatch")
	ErrBadTokenID = errors.New("token id out of range")
)
