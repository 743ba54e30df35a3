package cpu

import (
	"slices"
	"testing"

	"github.com/tilert-go/tilert/engine"
	"github.com/tilert-go/tilert/engine/internal/enginetest"
	"github.com/tilert-go/tilert/engine/internal/golden"
)

// The trained tiny models (testdata/models, scripts/train_tiny.py) have the
// peaked distributions of a model of real text, so fidelity and MTP can be
// judged where a random model only offers near ties.

// TestTrainedTeacherForced compares each position of a 512-token window of
// held-out text with HF's argmax: exact mode must agree wherever HF's own
// margin is clear of float32 noise, serving mode (fp8_ds_mla and bf16 MLA
// caches, fp8 indexer keys) on >= 95% of positions, its MTP drafts likewise.
func TestTrainedTeacherForced(t *testing.T) {
	for _, g := range enginetest.TrainedGoldens(t) {
		tf := g.TeacherForced
		l := goldenModel(t, g)
		for _, o := range []engine.Options{
			{Mode: engine.ModeExact},
			{Mode: engine.ModeServing, MLACache: engine.CacheFP8DSMLA},
			{Mode: engine.ModeServing, MLACache: engine.CacheBF16},
		} {
			name := g.Preset + "/" + string(o.Mode)
			if o.Mode == engine.ModeServing {
				name += "/" + string(o.MLACache)
			}
			t.Run(name, func(t *testing.T) {
				e := goldenEngine(t, l, o)
				lg, mtp := teacherForce(t, e, tf.IDs)
				agree, clearMiss := 0, 0
				for j, want := range tf.Argmax {
					if got := engine.Argmax(lg[j]); got == want {
						agree++
					} else if tf.Margin[j] > 1e-3 {
						clearMiss++
					}
				}
				magree := 0
				for j, want := range tf.MTPArgmax {
					if engine.Argmax(mtp[j]) == want {
						magree++
					}
				}
				n, nm := len(tf.Argmax), len(tf.MTPArgmax)
				frac, mfrac := float64(agree)/float64(n), float64(magree)/float64(nm)
				t.Logf("top-1 agreement with HF over %d positions: %d (%.1f%%), %d misses where HF's margin > 1e-3; MTP %d/%d (%.1f%%)",
					n, agree, 100*frac, clearMiss, magree, nm, 100*mfrac)
				if o.Mode == engine.ModeExact {
					if clearMiss > 0 {
						t.Errorf("exact mode: %d top-1 misses where HF's margin exceeds 1e-3", clearMiss)
					}
					return
				}
				if frac < golden.TrainedServingMin {
					t.Errorf("serving top-1 agreement %.1f%% < %.0f%%", 100*frac, 100*golden.TrainedServingMin)
				}
				if mfrac < golden.TrainedServingMin {
					t.Errorf("serving MTP top-1 agreement %.1f%% < %.0f%%", 100*mfrac, 100*golden.TrainedServingMin)
				}
			})
		}
	}
}

// TestTrainedMTP: on text prompts, serving-mode greedy output with MTP is
// identical to plain decode and the drafts are accepted >= 40% of the time.
func TestTrainedMTP(t *testing.T) {
	for _, g := range enginetest.TrainedGoldens(t) {
		t.Run(g.Preset, func(t *testing.T) {
			l := goldenModel(t, g)
			plain := goldenEngine(t, l, engine.Options{Mode: engine.ModeServing})
			spec := goldenEngine(t, l, engine.Options{Mode: engine.ModeServing, MTP: true})
			ids := g.TeacherForced.IDs
			for _, off := range []int{0, 128, 256, 384} {
				prompt := ids[off : off+24]
				want := enginetest.Generate(t, plain, 0, prompt, engine.Params{}, 48)
				got := enginetest.Generate(t, spec, 0, prompt, engine.Params{}, 48)
				if !slices.Equal(got, want) {
					t.Errorf("prompt at %d: MTP output %v differs from plain decode %v", off, got, want)
				}
			}
			st := spec.Stats()
			t.Logf("MTP acceptance %.2f (%d/%d drafts), %d tokens in %d steps", st.AcceptRate(), st.AcceptedTokens, st.DraftTokens, st.Tokens, st.Steps)
			if st.AcceptRate() < golden.TrainedMTPAcceptMin {
				t.Errorf("MTP acceptance %.2f < %.2f", st.AcceptRate(), golden.TrainedMTPAcceptMin)
			}
		})
	}
}
