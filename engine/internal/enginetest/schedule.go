package enginetest

import (
	"fmt"
	"slices"
	"testing"

	"github.com/tilert-go/tilert/engine"
)

// ScheduleSlots is the slots Schedule uses (engine.Options.Slots).
const ScheduleSlots = 3

// Schedule drives e (ScheduleSlots slots, room for prompt + 48 positions)
// through a serving-like run in which the set of stepped slots keeps
// changing, and returns its transcript: every step's tokens, finish reasons
// and logprobs and every slot event, one line each. Two engines that decode
// the same must give the same transcript. It is what a pipelined step
// (engine.Ahead) must not change:
//   - slot 0 greedy, ending at stop id stop (-1: none) or by MaxTokens 40;
//   - slot 1 sampled (seeded) leaves after step 6 without finishing
//     (Release while a step started ahead may still run) and slot 2's
//     saved prefill state is imported into it at once, then greedy;
//   - after step 9 slot 1 leaves again and slot 2 (prefilled at step 3,
//     left loaded) joins at the same moment: the next step has as many
//     rows as the one before, another slot in them; slot 2 ends by
//     MaxTokens 6;
//   - when slot 2 ends, slot 1 is prefilled with a new prompt (a join
//     while others run) and decodes with a presence penalty and logprobs
//     (steps that need the host) to MaxTokens 8;
//   - when that one ends, slot 2 is prefilled and decodes sampled with
//     frequency and repetition penalties and a bad word, no logprobs (the
//     adjustments uploaded with a step started ahead) to MaxTokens 12.
//
// slot0 returns slot 0's tokens (first included): run once with stop -1
// and choose a stop id from them (StopFrom(slot0, 12) ends it after the
// leave-and-join).
func Schedule(t testing.TB, e engine.Engine, vocab int, stop int) (transcript []string, slot0 []int) {
	t.Helper()
	log := func(f string, a ...any) { transcript = append(transcript, fmt.Sprintf(f, a...)) }
	prompts := [][]int{Prompt(23, vocab, 101), Prompt(17, vocab, 102), Prompt(29, vocab, 103), Prompt(13, vocab, 104)}
	greedy := func(n int) engine.Params { return engine.Params{MaxTokens: n} }
	var active []int
	start := func(slot, first int, p engine.Params) {
		t.Helper()
		fin, err := e.Start(slot, first, p)
		if err != nil {
			t.Fatalf("start slot %d: %+v", slot, err)
		}
		log("start slot %d first %d finish %q", slot, first, fin)
		if fin == engine.FinishNone {
			active = append(active, slot)
		}
	}
	leave := func(slot int) {
		t.Helper()
		e.Release(slot)
		active = slices.DeleteFunc(active, func(s int) bool { return s == slot })
		log("release slot %d", slot)
	}
	prefill := func(slot int, prompt []int, p engine.Params) int {
		t.Helper()
		first, err := e.Prefill(slot, prompt, p)
		if err != nil {
			t.Fatalf("prefill slot %d: %+v", slot, err)
		}
		log("prefill slot %d first %d", slot, first)
		return first
	}
	p0 := greedy(40)
	if stop >= 0 {
		p0.StopIDs = []int{stop}
	}
	p1 := engine.Params{MaxTokens: 40, Temperature: 0.8, TopP: 0.9, TopK: 20, Seed: 7}
	first0 := prefill(0, prompts[0], p0)
	slot0 = []int{first0}
	start(0, first0, p0)
	start(1, prefill(1, prompts[1], p1), p1)
	var first2 int
	var lpStarted, penStarted bool
	for step := 0; len(active) > 0; step++ {
		if step > 200 {
			t.Fatal("schedule did not end")
		}
		res, err := e.Step(active)
		if err != nil {
			t.Fatalf("step %d over %v: %+v", step, active, err)
		}
		var ended []int
		for _, r := range res {
			log("step %d slot %d tokens %v finish %q logprobs %v", step, r.Slot, r.Tokens, r.Finish, r.Logprobs)
			if r.Slot == 0 {
				slot0 = append(slot0, r.Tokens...)
			}
			if r.Finish != engine.FinishNone {
				ended = append(ended, r.Slot)
			}
		}
		for _, s := range ended {
			leave(s)
			switch {
			case s == 2 && !lpStarted:
				lpStarted = true
				p := engine.Params{MaxTokens: 8, PresencePenalty: 0.5, Logprobs: true, TopLogprobs: 2}
				start(1, prefill(1, prompts[3], p), p)
			case s == 1 && lpStarted && !penStarted:
				penStarted = true
				p := engine.Params{MaxTokens: 12, Temperature: 0.9, Seed: 9, FrequencyPenalty: 0.6, RepetitionPenalty: 1.3,
					BadWords: [][]int{{prompts[2][4]}}}
				start(2, prefill(2, prompts[2][:19], p), p)
			}
		}
		switch {
		case step == 3:
			first2 = prefill(2, prompts[2], greedy(6))
		case step == 6 && slices.Contains(active, 1):
			meta, segs, err := e.Export(2)
			if err != nil {
				t.Fatalf("export slot 2: %+v", err)
			}
			log("export slot 2 seq %d", meta.SeqLen)
			leave(1)
			if err := e.Import(1, meta, segs); err != nil {
				t.Fatalf("import into slot 1: %+v", err)
			}
			log("import slot 2's state into slot 1")
			start(1, first2, greedy(30))
		case step == 9 && slices.Contains(active, 1):
			leave(1)
			start(2, first2, greedy(6))
		}
	}
	return transcript, slot0
}

// StopFrom chooses a stop id from a slot's tokens: the first token at index
// from or later that does not occur before it (-1: none).
func StopFrom(toks []int, from int) int {
	for i := from; i < len(toks); i++ {
		if !slices.Contains(toks[:i], toks[i]) {
			return toks[i]
		}
	}
	return -1
}
