package gpu

import (
	"bytes"
	"testing"

	"github.com/tilert-go/tilert/engine"
	"github.com/tilert-go/tilert/engine/internal/enginetest"
)

// switchCase is one preset's input for the "a switch changes no bit" tests:
// its weights and a prompt short enough that every sequence stays within
// index_topk after n generated tokens.
type switchCase struct {
	src    Source
	prompt []int
	n      int
}

func newSwitchCase(t *testing.T, preset string) switchCase {
	t.Helper()
	w, src := hfSourceOf(t, enginetest.PresetDir(t, preset))
	const n = 12
	return switchCase{src: src, prompt: enginetest.Prompt(min(40, w.Config().IndexTopK-n-4), w.Config().VocabSize, 7), n: n}
}

// newSwitchCasePast is newSwitchCase with a prompt past index_topk, so
// that the indexer scores and selects (the fused attention and MoE paths).
func newSwitchCasePast(t *testing.T, preset string) switchCase {
	t.Helper()
	w, src := hfSourceOf(t, enginetest.PresetDir(t, preset))
	return switchCase{src: src, prompt: enginetest.Prompt(w.Config().IndexTopK+20, w.Config().VocabSize, 7), n: 12}
}

// switchRun is what one setting produced: slot 0's greedy tokens and cache
// bytes, two batched slots' tokens (half the prompt and all of it), and the
// recorded step graphs' launches counted by op name, in all (ops) and per
// graph run (runs).
type switchRun struct {
	toks  []int
	cache []byte
	batch [][]int
	ops   map[string]int
	runs  []map[string]int
}

// run decodes the case on a new engine (two slots, graphs on and kept),
// with whatever switches the caller set before.
func (c switchCase) run(t *testing.T, kind deviceKind, mtp bool) switchRun {
	t.Helper()
	e := newTestEngine(t, kind, c.src, engine.Options{MTP: mtp, MaxSeqLen: len(c.prompt) + c.n + 16, Slots: 2})
	e.m.graphs.on, e.m.graphs.hold = true, true
	var r switchRun
	r.toks = enginetest.GenerateKeep(t, e, 0, c.prompt, engine.Params{}, c.n)
	r.cache = exportBytes(t, e, 0)
	e.Release(0)
	r.batch = generateBatch(t, e, [][]int{c.prompt[:len(c.prompt)/2], c.prompt}, engine.Params{}, c.n)
	r.ops = map[string]int{}
	for _, run := range e.m.graphs.keep {
		c := map[string]int{}
		for _, op := range run {
			r.ops[op.name]++
			c[op.name]++
		}
		r.runs = append(r.runs, c)
	}
	e.m.graphs.hold, e.m.graphs.keep = false, nil
	return r
}

// sameAs reports where got (named name) differs from want (named ref):
// tokens, cache bytes or batched tokens.
func (got switchRun) sameAs(t *testing.T, want switchRun, name, ref string) {
	t.Helper()
	if i := enginetest.FirstDiff(got.toks, want.toks); i >= 0 {
		t.Errorf("%s: tokens differ from %s at %d:\n got %v\nwant %v", name, ref, i, got.toks, want.toks)
	}
	if !bytes.Equal(got.cache, want.cache) {
		t.Errorf("%s: caches differ from %s", name, ref)
	}
	for s := range want.batch {
		if i := enginetest.FirstDiff(got.batch[s], want.batch[s]); i >= 0 {
			t.Errorf("%s batched slot %d: tokens differ from %s at %d", name, s, ref, i)
		}
	}
}

// indexer_scores_wgh takes every launch, those of fewer than 2^19 keys on
// _wgh2 (2short: 65536 or fewer), unless the switch says otherwise
// (sessions 40, 42 and 43).
func TestIdxWGHRule(t *testing.T) {
	for _, cs := range []struct {
		mode  string
		nq, T int
		want  bool
	}{
		{"", 1, 131328, true}, {"", 4, 32768, true}, {"", 1, 65536, true}, {"", 1, 8448, true},
		{"long", 1, 131328, true}, {"long", 4, 32768, true}, {"long", 1, 65536, false}, {"long", 4, 8448, false},
		{"1", 1, 100, true}, {"0", 4, 131072, false}, {"2", 1, 8448, true}, {"2", 1, 131328, true},
	} {
		if got := idxWGHRule(cs.mode, cs.nq, cs.T); got != cs.want {
			t.Errorf("idxWGHRule(%q, %d, %d) = %v, want %v", cs.mode, cs.nq, cs.T, got, cs.want)
		}
	}
	for _, cs := range []struct {
		mode  string
		nq, T int
		want  bool
	}{{"2", 1, 8448, true}, {"2", 4, 16384, true}, {"2", 1, 131328, true}, {"2", 4, 131328, false}, {"1", 1, 8448, false},
		{"", 1, 8448, true}, {"", 1, 65536, true}, {"", 4, 32768, true}, {"", 2, 131328, true}, {"", 4, 131072, false},
		{"2short", 1, 65536, true}, {"2short", 1, 131328, false}, {"2short", 4, 32768, false}, {"long", 1, 8448, false}} {
		if got := idxWGHPair(cs.mode, cs.nq, cs.T); got != cs.want {
			t.Errorf("idxWGHPair(%q, %d, %d) = %v, want %v", cs.mode, cs.nq, cs.T, got, cs.want)
		}
	}
}
