package gpu

import (
	"testing"

	"github.com/tilert-go/tilert/engine"
	"github.com/tilert-go/tilert/engine/internal/enginetest"
	"github.com/tilert-go/tilert/engine/internal/golden"
)

// TILERT_GPU_MTP_PAIRS (pairs.go) on the trained tiny models, where drafts
// are accepted most of the time, so that both of mtp_pair_select's choices
// run: greedy MTP decoding of text prompts with the MTP forward over
// candidate pairs gives the tokens of the MTP forward over the rows the host
// chose, and its drafts are accepted as often (the emulator: exactly as
// often, each MTP row's arithmetic not depending on the rows beside it;
// the GPU: its two-row launches may round a near-tie the other way). On the
// emulator a selection that always took the token's row must show.
func TestEmuMTPPairs(t *testing.T) { testMTPPairs(t, onEmu) }
func TestGPUMTPPairs(t *testing.T) { testMTPPairs(t, onGPU) }

func testMTPPairs(t *testing.T, kind deviceKind) {
	gs := enginetest.TrainedGoldens(t)
	if kind == onGPU {
		gpuDevice(t)
	}
	defer func(on bool) { mtpPairsOn = on }(mtpPairsOn)
	for _, g := range gs {
		t.Run(g.Preset, func(t *testing.T) {
			_, src := hfSourceOf(t, enginetest.GoldenDir(t, g))
			ids := g.TeacherForced.IDs
			type result struct {
				toks          [][]int
				drafts, accep int64
				pairs         int
			}
			gen := func(pairs, broken bool) result {
				mtpPairsOn = pairs
				mtpPairsBroken = broken
				defer func() { mtpPairsBroken = false }()
				e := newTestEngine(t, kind, src, engine.Options{MaxSeqLen: 1024, MTP: true})
				var r result
				for _, off := range []int{0, 128, 256, 384} {
					r.toks = append(r.toks, enginetest.Generate(t, e, 0, ids[off:off+24], engine.Params{}, 48))
				}
				st := e.Stats()
				r.drafts, r.accep, r.pairs = st.DraftTokens, st.AcceptedTokens, e.m.ah.pairs
				return r
			}
			want := gen(false, false)
			got := gen(true, false)
			for i := range want.toks {
				if j := enginetest.FirstDiff(got.toks[i], want.toks[i]); j >= 0 {
					t.Errorf("prompt %d: tokens with the MTP forward over pairs differ from %d:\n got %v\nwant %v", i, j, got.toks[i], want.toks[i])
				}
			}
			rate := func(r result) float64 { return float64(r.accep) / float64(max(r.drafts, 1)) }
			t.Logf("%s %s: acceptance %.3f (%d/%d) over pairs, %.3f (%d/%d) without; %d MTP forwards over pairs",
				kind, g.Preset, rate(got), got.accep, got.drafts, rate(want), want.accep, want.drafts, got.pairs)
			if got.pairs < int(got.drafts)/2 {
				t.Errorf("%d MTP forwards over pairs for %d drafts: the pairs path did not run", got.pairs, got.drafts)
			}
			if want.pairs != 0 {
				t.Errorf("%d MTP forwards over pairs with TILERT_GPU_MTP_PAIRS off", want.pairs)
			}
			if rate(got) < golden.TrainedMTPAcceptMin {
				t.Errorf("acceptance %.3f over pairs under %.2f", rate(got), golden.TrainedMTPAcceptMin)
			}
			if kind == onEmu {
				if got.accep != want.accep || got.drafts != want.drafts {
					t.Errorf("emulator: %d/%d drafts accepted over pairs, %d/%d without: the same arithmetic must draft the same", got.accep, got.drafts, want.accep, want.drafts)
				}
				if bad := gen(true, true); bad.accep == want.accep {
					t.Errorf("with the selection broken (row 2i for every row) %d drafts accepted as before: the check cannot fail", bad.accep)
				}
			} else if d := rate(got) - rate(want); d > 0.05 || d < -0.05 {
				t.Errorf("acceptance %.3f over pairs against %.3f: more than near-ties apart", rate(got), rate(want))
			}
		})
	}
}
