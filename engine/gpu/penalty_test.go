package gpu

import (
	"fmt"
	"math"
	"testing"

	"github.com/tilert-go/tilert/engine"
	"github.com/tilert-go/tilert/engine/internal/enginetest"
)

// Penalties, logit_bias, min_tokens and logprobs give the same tokens and
// logprobs on the GPU (and the emulator) as on the CPU engine: greedy, so
// the choice is the adjusted logits' arg-max; with MTP, so a draft row's
// penalties count the draft as generated.
func TestEmuPenaltiesMatchCPU(t *testing.T) { testPenaltiesMatchCPU(t, onEmu, 0) }
func TestGPUPenaltiesMatchCPU(t *testing.T) { testPenaltiesMatchCPU(t, onGPU, 0) }

// The tensor-parallel engine picks on rank 0's gathered logits: the same.
func TestEmuShardPenaltiesMatchCPU(t *testing.T) { testPenaltiesMatchCPU(t, onEmu, 2) }

type lpRun struct {
	toks []int
	lps  []engine.TokenLogprobs
}

func generateLP(t *testing.T, e lpEngine, prompt []int, p engine.Params, n int) lpRun {
	t.Helper()
	first, err := e.Prefill(0, prompt, p)
	if err != nil {
		t.Fatalf("prefill: %+v", err)
	}
	lp0, ok := e.PrefillLogprobs(0)
	if !ok {
		t.Fatal("no logprobs for the prefill's token")
	}
	run := lpRun{toks: []int{first}, lps: []engine.TokenLogprobs{lp0}}
	fin, err := e.Start(0, first, p)
	for err == nil && fin == engine.FinishNone && len(run.toks) < n {
		var res []engine.StepResult
		if res, err = e.Step([]int{0}); err == nil {
			if len(res[0].Logprobs) != len(res[0].Tokens) {
				t.Fatalf("%d logprobs for %d tokens", len(res[0].Logprobs), len(res[0].Tokens))
			}
			run.toks = append(run.toks, res[0].Tokens...)
			run.lps = append(run.lps, res[0].Logprobs...)
			fin = res[0].Finish
		}
	}
	if err != nil {
		t.Fatalf("decode: %+v", err)
	}
	e.Release(0)
	return run
}

type lpEngine interface {
	engine.Engine
	PrefillLogprobs(int) (engine.TokenLogprobs, bool)
}

func testPenaltiesMatchCPU(t *testing.T, kind deviceKind, ranks int) {
	if kind == onGPU {
		gpuDevice(t)
	}
	for _, pr := range enginetest.Presets {
		t.Run(pr, func(t *testing.T) {
			w, src := hfSourceOf(t, enginetest.PresetDir(t, pr))
			vocab := w.Config().VocabSize
			prompt := genCases(vocab)[1].prompt
			for _, mtp := range []bool{false, true} {
				opts := engine.Options{MTP: mtp, MaxSeqLen: maxSeq, Slots: 1}
				ce := newCPU(t, w, opts)
				var ge lpEngine = newTestEngine(t, kind, src, opts)
				if ranks > 0 {
					ge = newShardTest(t, kind, src, opts, ranks, CommLocal)
				}
				p := engine.Params{RepetitionPenalty: 1.4, PresencePenalty: 0.5, FrequencyPenalty: 0.7, MinTokens: 8,
					StopIDs: w.Config().EOS, PromptIDs: prompt, Logprobs: true, TopLogprobs: 5,
					LogitBias: map[int]float32{prompt[0]: 2.5, prompt[1]: -100, 3: 1}}
				want := generateLP(t, ce, prompt, p, genTokens)
				got := generateLP(t, ge, prompt, p, genTokens)
				diff := 0
				if i := enginetest.FirstDiff(got.toks, want.toks); i >= 0 {
					diff = len(want.toks) - i
					t.Errorf("%s mtp=%v: tokens differ from %d:\n got %v\nwant %v", kind, mtp, i, got.toks, want.toks)
				}
				// The penalties bite: plain greedy decodes something else.
				plain := enginetest.Generate(t, ce, 0, prompt, engine.Params{}, genTokens)
				if enginetest.FirstDiff(plain, want.toks) < 0 {
					t.Errorf("penalties changed nothing: %v", plain)
				}
				var maxD float64
				ids := 0
				for i := range min(len(got.lps), len(want.lps)) {
					maxD = math.Max(maxD, math.Abs(float64(got.lps[i].Logprob-want.lps[i].Logprob)))
					for j := range min(len(got.lps[i].Top), len(want.lps[i].Top)) {
						if got.lps[i].Top[j].ID != want.lps[i].Top[j].ID {
							ids++
						}
						maxD = math.Max(maxD, math.Abs(float64(got.lps[i].Top[j].Logprob-want.lps[i].Top[j].Logprob)))
					}
				}
				name := fmt.Sprintf("%s %s penalties+bias+min_tokens greedy == CPU", kind, pr)
				if ranks > 0 {
					name = fmt.Sprintf("%s %s TP-%d penalties+bias+min_tokens greedy == CPU", kind, pr, ranks)
				}
				if mtp {
					name += " (MTP)"
				}
				record(t, name, "tokens after first mismatch", float64(diff), 0)
				record(t, name+": logprobs", "max |d logprob|", maxD, flipErr) // the backends' logits agree to this (TestGPULogitsMatchEmulator)
				record(t, name+": top-5 ids", "mismatched ids", float64(ids), 0)
			}
		})
	}
}
