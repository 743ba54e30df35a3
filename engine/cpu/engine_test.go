package cpu

import (
	"bytes"
	"errors"
	"fmt"
	"math"
	"slices"
	"testing"

	"github.com/tilert-go/tilert/engine"
	"github.com/tilert-go/tilert/engine/internal/enginetest"
)

var modes = []engine.Options{
	{Mode: engine.ModeExact},
	{Mode: engine.ModeServing, MLACache: engine.CacheFP8DSMLA},
	{Mode: engine.ModeServing, MLACache: engine.CacheBF16},
}

func modeName(o engine.Options) string {
	if o.Mode == engine.ModeExact {
		return "exact"
	}
	return "serving-" + string(o.MLACache)
}

func TestMTPOutputIdentical(t *testing.T) {
	for _, pr := range enginetest.Presets {
		for _, o := range modes {
			t.Run(pr+"/"+modeName(o), func(t *testing.T) {
				o.MaxSeqLen = 256
				plain := newEngine(t, pr, o)
				o.MTP = true
				spec := newEngine(t, pr, o)
				for _, p := range []engine.Params{{}, {Temperature: 0.8, TopP: 0.9, TopK: 50, Seed: 11}} {
					for _, plen := range []int{5, 70} {
						prompt := enginetest.Prompt(plen, 1000, plen)
						a := enginetest.Generate(t, plain, 0, prompt, p, 40)
						b := enginetest.Generate(t, spec, 0, prompt, p, 40)
						if !slices.Equal(a, b) {
							t.Fatalf("params %+v prompt %d: without MTP %v\nwith MTP %v", p, plen, a, b)
						}
					}
				}
				st := spec.Stats()
				if st.DraftTokens == 0 {
					t.Fatal("MTP engine drafted nothing")
				}
				t.Logf("MTP acceptance %d/%d = %.2f, steps %d for %d tokens", st.AcceptedTokens, st.DraftTokens, st.AcceptRate(), st.Steps, st.Tokens)
				if plain.Stats().DraftTokens != 0 {
					t.Fatal("plain engine drafted")
				}
			})
		}
	}
}

// TestBatchedStep checks that one batched step over 4 slots gives exactly
// what 4 separate runs give, with slots finishing at different times.
func TestBatchedStep(t *testing.T) {
	for _, pr := range enginetest.Presets {
		for _, mtp := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/mtp=%v", pr, mtp), func(t *testing.T) {
				o := engine.Options{Mode: engine.ModeServing, Slots: 4, MaxSeqLen: 256, MTP: mtp}
				e := newEngine(t, pr, o)
				prompts := [][]int{enginetest.Prompt(3, 1000, 1), enginetest.Prompt(40, 1000, 2), enginetest.Prompt(9, 1000, 3), enginetest.Prompt(66, 1000, 4)}
				params := []engine.Params{{}, {Temperature: 1, Seed: 5}, {}, {Temperature: 0.5, TopK: 20, Seed: 6}}
				maxTok := []int{12, 30, 1, 25}
				var want [][]int
				for i := range prompts {
					want = append(want, enginetest.Generate(t, e, i, prompts[i], params[i], maxTok[i]))
				}
				batch := make([]engine.Params, len(params))
				for i := range params {
					batch[i] = params[i]
					batch[i].MaxTokens = maxTok[i]
				}
				got := enginetest.Batch(t, e, prompts, batch)
				for i := range want {
					if !slices.Equal(got[i], want[i]) {
						t.Errorf("slot %d: batched %v, alone %v", i, got[i], want[i])
					}
					if len(got[i]) != maxTok[i] {
						t.Errorf("slot %d: %d tokens, max_tokens %d", i, len(got[i]), maxTok[i])
					}
				}
			})
		}
	}
}

// TestExportImport moves a prefilled state to another engine's slot and
// checks the continuation and the bytes.
func TestExportImport(t *testing.T) {
	for _, pr := range enginetest.Presets {
		for _, o := range modes[1:] {
			for _, mtp := range []bool{false, true} {
				t.Run(fmt.Sprintf("%s/%s/mtp=%v", pr, modeName(o), mtp), func(t *testing.T) {
					o.MaxSeqLen, o.Slots, o.MTP = 256, 2, mtp
					src := newEngine(t, pr, o)
					dst := newEngine(t, pr, o)
					prompt := enginetest.Prompt(70, 1000, 9)
					want := enginetest.Generate(t, src, 0, prompt, engine.Params{}, 24)

					first, err := src.Prefill(1, prompt, engine.Params{})
					if err != nil {
						t.Fatal(err)
					}
					meta, segs, err := src.Export(1)
					if err != nil {
						t.Fatal(err)
					}
					if meta.SeqLen != len(prompt) || meta.MTPLen != len(prompt) || meta.LastToken != prompt[len(prompt)-1] {
						t.Fatalf("meta %+v", meta)
					}
					// The receive buffer is the cache: write the bytes there, then hand over.
					buf, err := dst.SlotBuffer(1)
					if err != nil {
						t.Fatal(err)
					}
					for _, s := range segs {
						copy(buf[s.Offset:], s.Data)
					}
					if err := dst.Import(1, meta, nil); err != nil {
						t.Fatal(err)
					}
					_, segs2, err := dst.Export(1)
					if err != nil {
						t.Fatal(err)
					}
					for i := range segs {
						if segs[i].Offset != segs2[i].Offset || !bytes.Equal(segs[i].Data, segs2[i].Data) {
							t.Fatalf("segment %d differs after import", i)
						}
					}
					got := enginetest.DecodeFrom(t, dst, 1, first, engine.Params{}, 24)
					if !slices.Equal(got, want) {
						t.Fatalf("imported continuation %v, want %v", got, want)
					}

					// A state without the MTP entry of the last position (a
					// prefill that did not draft): the engine recomputes it.
					meta.MTPLen--
					if err := dst.Import(0, meta, segs); err != nil {
						t.Fatal(err)
					}
					got = enginetest.DecodeFrom(t, dst, 0, first, engine.Params{}, 24)
					if !slices.Equal(got, want) {
						t.Fatalf("import with mtp_len-1: %v, want %v", got, want)
					}
				})
			}
		}
	}
}

func TestExactExportImport(t *testing.T) {
	pr := enginetest.Presets[0]
	e := newEngine(t, pr, engine.Options{Mode: engine.ModeExact, Slots: 2, MaxSeqLen: 128, MTP: true})
	prompt := enginetest.Prompt(40, 1000, 5)
	first, err := e.Prefill(0, prompt, engine.Params{})
	if err != nil {
		t.Fatal(err)
	}
	meta, segs, err := e.Export(0)
	if err != nil {
		t.Fatal(err)
	}
	if err := e.Import(1, meta, segs); err != nil {
		t.Fatal(err)
	}
	// exact-mode export is quantised; the imported float32 caches re-export
	// to values within fp8 rounding of the first export.
	_, segs2, err := e.Export(1)
	if err != nil {
		t.Fatal(err)
	}
	b1, b2 := make([]byte, e.m.layout.SlotBytes), make([]byte, e.m.layout.SlotBytes)
	for i := range segs {
		copy(b1[segs[i].Offset:], segs[i].Data)
		copy(b2[segs2[i].Offset:], segs2[i].Data)
	}
	c1, c2 := newByteCaches(e.m.layout, b1), newByteCaches(e.m.layout, b2)
	l1, r1, l2, r2 := make([]float32, 512), make([]float32, 64), make([]float32, 512), make([]float32, 64)
	for l := range c1 {
		for p := 0; p < meta.SeqLen; p++ {
			c1[l].readMLA(p, l1, r1)
			c2[l].readMLA(p, l2, r2)
			var amax, d float64
			for i := range l1 {
				amax = max(amax, math.Abs(float64(l1[i])))
				d = max(d, math.Abs(float64(l1[i]-l2[i])))
			}
			if d > 0.07*amax || !slices.Equal(r1, r2) {
				t.Fatalf("layer %d pos %d: re-export moved latent by %g of %g", l, p, d, amax)
			}
		}
	}
	a := enginetest.DecodeFrom(t, e, 0, first, engine.Params{}, 8)
	b := enginetest.DecodeFrom(t, e, 1, first, engine.Params{}, 8)
	t.Logf("exact %v, after fp8 round trip %v", a, b)
}

func TestStopAndErrors(t *testing.T) {
	e := newEngine(t, enginetest.Presets[1], engine.Options{Mode: engine.ModeServing, Slots: 2, MaxSeqLen: 128, MTP: true})
	prompt := enginetest.Prompt(10, 1000, 2)
	all := enginetest.Generate(t, e, 0, prompt, engine.Params{}, 20)
	stop := all[7]
	k := slices.Index(all, stop)
	got := enginetest.Generate(t, e, 0, prompt, engine.Params{StopIDs: []int{stop}}, 20)
	if !slices.Equal(got, all[:k+1]) {
		t.Errorf("stop at %d: %v, want %v", stop, got, all[:k+1])
	}
	// first token is a stop token
	first, _ := e.Prefill(0, prompt, engine.Params{})
	if fin, err := e.Start(0, first, engine.Params{StopIDs: []int{first}}); err != nil || fin != engine.FinishStop {
		t.Errorf("Start with stop first token: %v %v", fin, err)
	}
	e.Release(0)

	if _, err := e.Step([]int{0}); !errors.Is(err, engine.ErrSlotState) {
		t.Errorf("step on free slot: %v", err)
	}
	if _, err := e.Prefill(0, prompt, engine.Params{}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.Prefill(0, prompt, engine.Params{}); !errors.Is(err, engine.ErrSlotBusy) {
		t.Errorf("prefill into busy slot: %v", err)
	}
	if _, err := e.Prefill(1, enginetest.Prompt(200, 1000, 1), engine.Params{}); !errors.Is(err, engine.ErrTooLong) {
		t.Errorf("too long prompt: %v", err)
	}
	if _, err := e.Prefill(1, []int{5000}, engine.Params{}); !errors.Is(err, engine.ErrBadTokenID) {
		t.Errorf("bad token: %v", err)
	}
	if err := e.Import(1, engine.SlotMeta{SeqLen: 10, MTPLen: 3}, nil); !errors.Is(err, engine.ErrBadLayout) {
		t.Errorf("incomplete MTP state: %v", err)
	}
	if err := e.Import(1, engine.SlotMeta{SeqLen: 10, MTPLen: 10}, []engine.Segment{{Offset: e.Layout().SlotBytes, Data: []byte{1}}}); !errors.Is(err, engine.ErrBadLayout) {
		t.Errorf("segment outside buffer: %v", err)
	}
	if _, err := e.Step([]int{7}); !errors.Is(err, engine.ErrBadSlot) {
		t.Errorf("bad slot: %v", err)
	}
	// max_seq_len ends a sequence with "length"
	long := enginetest.Generate(t, e, 1, enginetest.Prompt(120, 1000, 3), engine.Params{}, 0)
	if 120+len(long) > 128 || len(long) < 1 {
		t.Errorf("generated %d tokens past a 120-token prompt with max_seq_len 128", len(long))
	}
}
