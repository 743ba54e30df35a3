package gpu

import (
	"fmt"
	"testing"

	"github.com/tilert-go/tilert/engine"
	"github.com/tilert-go/tilert/engine/internal/enginetest"
	"github.com/tilert-go/tilert/engine/internal/golden"
)

// The trained tiny models (testdata/models, scripts/train_tiny.py) on the
// GPU engine in serving mode (fp8_ds_mla MLA cache, fp8 indexer keys):
// teacher-forced top-1 agreement with HF over the golden's 512-token window
// of held-out text (>= golden.TrainedServingMin, MTP drafts likewise), and on
// text prompts greedy output equal to the CPU serving engine's, identical
// with MTP on, with MTP acceptance >= golden.TrainedMTPAcceptMin.

func TestEmuTrained(t *testing.T) { testTrained(t, onEmu) }
func TestGPUTrained(t *testing.T) { testTrained(t, onGPU) }

func testTrained(t *testing.T, kind deviceKind) {
	gs := enginetest.TrainedGoldens(t)
	if kind == onGPU {
		gpuDevice(t)
	}
	for _, g := range gs {
		t.Run(g.Preset, func(t *testing.T) {
			dir := enginetest.GoldenDir(t, g)
			w, src := hfSourceOf(t, dir)
			tf := g.TeacherForced

			e := newTestEngine(t, kind, src, engine.Options{MaxSeqLen: 1024})
			lg, mtp, err := e.TeacherForce(0, tf.IDs)
			if err != nil {
				t.Fatalf("%+v", err)
			}
			agree, magree := 0, 0
			for j, want := range tf.Argmax {
				if engine.Argmax(lg[j]) == want {
					agree++
				}
			}
			for j, want := range tf.MTPArgmax {
				if j < len(mtp) && engine.Argmax(mtp[j]) == want {
					magree++
				}
			}
			frac := float64(agree) / float64(len(tf.Argmax))
			mfrac := float64(magree) / float64(len(tf.MTPArgmax))
			t.Logf("%s serving top-1 agreement with HF over %d positions: %.1f%%, MTP %.1f%%", kind, len(tf.Argmax), 100*frac, 100*mfrac)
			record(t, fmt.Sprintf("%s %s serving top-1 vs HF (512-token text)", kind, g.Preset), "1 - agreement", 1-frac, 1-golden.TrainedServingMin)
			record(t, fmt.Sprintf("%s %s serving MTP top-1 vs HF (512-token text)", kind, g.Preset), "1 - agreement", 1-mfrac, 1-golden.TrainedServingMin)

			opts := engine.Options{MaxSeqLen: 1024}
			ce := newCPU(t, w, opts)
			mopts := opts
			mopts.MTP = true
			ge := newTestEngine(t, kind, src, mopts)
			gp := newTestEngine(t, kind, src, opts)
			diff, pdiff := 0, 0
			for _, off := range []int{0, 128, 256, 384} {
				prompt := tf.IDs[off : off+24]
				want := enginetest.Generate(t, ce, 0, prompt, engine.Params{}, 48)
				if got := enginetest.Generate(t, gp, 0, prompt, engine.Params{}, 48); enginetest.FirstDiff(got, want) >= 0 {
					i := enginetest.FirstDiff(got, want)
					pdiff += len(want) - i
					t.Errorf("prompt at %d: %s tokens differ from CPU serving from %d:\n got %v\nwant %v", off, kind, i, got, want)
				}
				got := enginetest.Generate(t, ge, 0, prompt, engine.Params{}, 48)
				if i := enginetest.FirstDiff(got, want); i >= 0 {
					diff += len(want) - i
					t.Errorf("prompt at %d: %s MTP tokens differ from CPU plain decode from %d:\n got %v\nwant %v", off, kind, i, got, want)
				}
			}
			st := ge.Stats()
			t.Logf("%s MTP acceptance %.2f (%d/%d drafts), %d tokens in %d steps", kind, st.AcceptRate(), st.AcceptedTokens, st.DraftTokens, st.Tokens, st.Steps)
			record(t, fmt.Sprintf("%s %s greedy == CPU serving, text prompts", kind, g.Preset), "tokens after first mismatch", float64(pdiff), 0)
			record(t, fmt.Sprintf("%s %s greedy (MTP) == CPU serving (no MTP), text prompts", kind, g.Preset), "tokens after first mismatch", float64(diff), 0)
			record(t, fmt.Sprintf("%s %s MTP acceptance, text prompts", kind, g.Preset), "1 - acceptance", 1-st.AcceptRate(), 1-golden.TrainedMTPAcceptMin)
		})
	}
}
