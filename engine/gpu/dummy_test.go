package gpu

import (
	"bytes"
	"encoding/binary"
	"testing"

	"github.com/tilert-go/tilert/cuda"

	"github.com/tilert-go/tilert/engine"
	"github.com/tilert-go/tilert/model"
	"github.com/tilert-go/tilert/model/synth"
)

// Dummy weights fit every tensor the engine loads (shapes, FP8 experts,
// absorbed matrices, bf16 tables) and give finite logits: a prefill and a
// few steps run on the emulator for both families.
func TestDummySourceRuns(t *testing.T) {
	for _, name := range []string{"deepseek-v3.2-tiny", "glm-5-tiny"} {
		t.Run(name, func(t *testing.T) {
			cfg := synthConfig(t, name)
			e, err := NewEmulated(Dummy(cfg, 3), engine.Options{Mode: engine.ModeServing, Slots: 1, MaxSeqLen: 64})
			if err != nil {
				t.Fatal(err)
			}
			defer e.Close()
			first, err := e.Prefill(0, []int{5, 9, 200, 17}, engine.Params{MaxTokens: 4})
			if err != nil {
				t.Fatal(err)
			}
			if _, err := e.Start(0, first, engine.Params{MaxTokens: 4}); err != nil {
				t.Fatal(err)
			}
			res, err := e.Step([]int{0})
			if err != nil {
				t.Fatal(err)
			}
			if len(res) != 1 || len(res[0].Tokens) != 1 || res[0].Tokens[0] < 0 || res[0].Tokens[0] >= cfg.VocabSize {
				t.Fatalf("step result %+v", res)
			}
		})
	}
}

// hideShare is a Source without matrixSharer: every expert from the host.
type hideShare struct{ Source }

// Dummy's experts share one matrix a shape, so the uploader puts it on the
// device once and copies it there for the rest; each expert must hold the
// same bytes as when every one comes from the host.
func TestDummyExpertsCopiedOnDevice(t *testing.T) {
	cfg := synthConfig(t, "deepseek-v3.2-tiny")
	layer := -1
	for l := range cfg.NumLayers {
		if cfg.IsMoELayer(l) {
			layer = l
			break
		}
	}
	if layer < 0 {
		t.Fatal("the tiny preset has no MoE layer")
	}
	E, I, H := cfg.NRoutedExperts, cfg.MoEIntermediateSize, cfg.HiddenSize
	src := Dummy(cfg, 3)
	for _, tc := range []struct {
		name   string
		src    Source
		copied int
	}{{"shared", src, 2*E - 1}, {"from the host", hideShare{src}, 0}} {
		t.Run(tc.name, func(t *testing.T) {
			dev := newEmu()
			u := newUploader(dev, tc.src)
			for _, proj := range []string{"gate_proj", "up_proj"} { // one shape: up's experts copy gate's
				wt, st := u.experts(layer, E, proj, I, H)
				if u.err != nil {
					t.Fatal(u.err)
				}
				wtab, stab := make([]byte, 8*E), make([]byte, 8*E)
				if err := dev.download(wtab, wt); err != nil {
					t.Fatal(err)
				}
				if err := dev.download(stab, st); err != nil {
					t.Fatal(err)
				}
				for e := range E {
					m, err := src.Expert(layer, e, proj, I, H)
					if err != nil {
						t.Fatal(err)
					}
					w, s := make([]byte, len(m.FP8)), make([]byte, 4*len(m.Scale))
					if err := dev.download(w, cuda.DevPtr(binary.LittleEndian.Uint64(wtab[8*e:]))); err != nil {
						t.Fatal(err)
					}
					if err := dev.download(s, cuda.DevPtr(binary.LittleEndian.Uint64(stab[8*e:]))); err != nil {
						t.Fatal(err)
					}
					if !bytes.Equal(w, m.FP8) || !bytes.Equal(s, f32Bytes(m.Scale)) {
						t.Fatalf("%s expert %d: the device bytes differ from the source's", proj, e)
					}
				}
			}
			if u.copied != tc.copied {
				t.Errorf("%d experts copied on the device, want %d", u.copied, tc.copied)
			}
			// two projections' experts and their two pointer tables
			if want := int64(2*E*(I*H+4*((I+127)/128)*((H+127)/128)) + 2*2*8*E); u.bytes != want {
				t.Errorf("uploader counts %d bytes, want %d (a copy is a weight too)", u.bytes, want)
			}
		})
	}
}

// synthConfig is a synthetic preset's model configuration.
func synthConfig(t *testing.T, preset string) *model.Config {
	t.Helper()
	p, err := synth.Lookup(preset)
	if err != nil {
		t.Fatal(err)
	}
	b, err := synth.Build(p, 0)
	if err != nil {
		t.Fatal(err)
	}
	return b.Config
}
