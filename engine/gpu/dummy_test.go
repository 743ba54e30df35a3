package gpu

import (
	"bytes"
	"encoding/binary"
	"testing"

	"github.com/tilert-go/tilert/cuda"

	"github.com/tilert-go/tilert/engine"
	"github.com/tilert-go/tilert/engine/internal/enginetest"
	"github.com/tilert-go/tilert/model"
	"github.com/tilert-go/tilert/model/synth"
	"github.com/tilert-go/tilert/numeric"
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

// Dummy's large bf16 tensors repeat one period (bf16Rand), so the uploader
// sends the period and fills the rest on the device (periodic): the tables
// and the head must hold the bytes of the whole tensor sent from the host,
// whether the period is drawn before the whole block or after, and an
// engine on them must generate the same tokens. bf16Period is cut so that
// the tiny presets' tables span several periods, not a whole number.
func TestDummyPeriodicTensorsOnDevice(t *testing.T) {
	defer func(p int) { bf16Period = p }(bf16Period)
	bf16Period = 1000
	for _, name := range []string{"deepseek-v3.2-tiny", "glm-5-tiny"} {
		t.Run(name, func(t *testing.T) {
			cfg := synthConfig(t, name)
			V, H := cfg.VocabSize, cfg.HiddenSize
			if V*H <= 2*bf16Period || V*H%bf16Period == 0 {
				t.Fatalf("V x H = %d: want several periods and a partial one", V*H)
			}
			tensors := []string{model.EmbedTokensName}
			if !cfg.TieWordEmbeddings {
				tensors = append(tensors, model.LMHeadName)
			}
			for _, wholeFirst := range []bool{false, true} {
				src := Dummy(cfg, 3)
				if wholeFirst {
					if _, err := src.Get(model.EmbedTokensName); err != nil {
						t.Fatal(err)
					}
				}
				dev := newEmu()
				u := newUploader(dev, src)
				for _, tn := range tensors {
					var p cuda.DevPtr
					var want []float32
					if tn == model.EmbedTokensName {
						p = u.table(tn, V, H)
						tt, err := src.Get(tn)
						if err != nil {
							t.Fatal(err)
						}
						want = tt.Data
					} else {
						l := u.lin(tn, V, H)
						if l.kind != linBF16 {
							t.Fatalf("%s: kind %v, want bf16", tn, l.kind)
						}
						p = l.w
						m, err := src.Linear(tn, V, H)
						if err != nil {
							t.Fatal(err)
						}
						want = m.F32
					}
					if u.err != nil {
						t.Fatal(u.err)
					}
					wb := make([]byte, 2*len(want))
					numeric.EncodeBF16(wb, want)
					got := make([]byte, len(wb))
					if err := dev.download(got, p); err != nil {
						t.Fatal(err)
					}
					if i := firstByteDiff(got, wb); i >= 0 {
						t.Fatalf("%s (whole block drawn first: %v): the device bytes differ from the host tensor's at byte %d", tn, wholeFirst, i)
					}
				}
				if u.filled == 0 {
					t.Errorf("no device copies filled a period (whole block first: %v)", wholeFirst)
				}
				if want := int64(2 * V * H * len(tensors)); u.bytes != want {
					t.Errorf("uploader counts %d bytes, want %d", u.bytes, want)
				}
			}
			// Neither a norm, nor a shape other than the tensor's, takes the
			// periodic path.
			u := newUploader(newEmu(), Dummy(cfg, 3))
			if _, ok := u.periodic(model.FinalNormName, 1, H); ok {
				t.Errorf("the final norm was placed as periodic")
			}
			if _, ok := u.periodic(model.EmbedTokensName, H, V); ok {
				t.Errorf("the table was placed as periodic under the transposed shape")
			}
			// An engine on the periodic placement generates what one on the
			// whole tensors does.
			sameTokens(t, "periodic", Dummy(cfg, 3), "whole", hideShare{Dummy(cfg, 3)})
		})
	}
}

// sameTokens fails t unless emulated engines on sources a and b generate the
// same greedy tokens from one prompt.
func sameTokens(t *testing.T, an string, a Source, bn string, b Source) {
	t.Helper()
	var toks [2][]int
	for i, s := range []Source{a, b} {
		e, err := NewEmulated(s, engine.Options{Mode: engine.ModeServing, Slots: 1, MaxSeqLen: 64})
		if err != nil {
			t.Fatal(err)
		}
		toks[i] = generateBatch(t, e, [][]int{{5, 9, 200, 17}}, engine.Params{}, 6)[0]
		e.Close()
	}
	if i := enginetest.FirstDiff(toks[0], toks[1]); i >= 0 {
		t.Errorf("tokens differ at %d: %s %v, %s %v", i, an, toks[0], bn, toks[1])
	}
}

func firstByteDiff(a, b []byte) int {
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			return i
		}
	}
	if len(a) != len(b) {
		return min(len(a), len(b))
	}
	return -1
}

// DummyOneBank points every MoE layer after the first at the first's
// routed experts: the device holds one bank, each layer's tables name its
// addresses, and the engine generates what it does on Dummy (whose experts
// of a shape hold the same bytes anyway).
func TestDummyOneBank(t *testing.T) {
	for _, name := range []string{"deepseek-v3.2-tiny", "glm-5-tiny"} {
		t.Run(name, func(t *testing.T) {
			cfg := synthConfig(t, name)
			moe := 0
			for l := range cfg.NumAllLayers() {
				if cfg.IsMoELayer(l) {
					moe++
				}
			}
			if moe < 2 {
				t.Fatalf("%s has %d MoE layers; the test needs two", name, moe)
			}
			E, I, H := int64(cfg.NRoutedExperts), int64(cfg.MoEIntermediateSize), int64(cfg.HiddenSize)
			per := func(rows, cols int64) int64 { // uploader.experts' bytes for one projection
				return E * (rows*cols + 4*((rows+127)/128)*((cols+127)/128))
			}
			bankBytes := 2*per(I, H) + per(H, I) + 3*2*8*E // and the tables of pointers
			var all [2]*dweights
			for i, src := range []Source{Dummy(cfg, 3), DummyOneBank(cfg, 3)} {
				w, _, err := uploadWeights(newEmu(), src, cfg)
				if err != nil {
					t.Fatal(err)
				}
				all[i] = w
			}
			if d := all[0].bytes - all[1].bytes; d != int64(moe-1)*bankBytes {
				t.Errorf("one bank holds %d bytes fewer, want %d (%d MoE layers of %d bytes of experts)", d, int64(moe-1)*bankBytes, moe, bankBytes)
			}
			var first *dlayer
			for l, lw := range all[1].layers {
				if !lw.MoE {
					continue
				}
				if first == nil {
					first = lw
					continue
				}
				if lw.expW != first.expW || lw.expS != first.expS {
					t.Errorf("layer %d: expert tables %v %v, want the first MoE layer's %v %v", l, lw.expW, lw.expS, first.expW, first.expS)
				}
				if p := all[0].layers[l]; p.expW == first.expW {
					t.Errorf("layer %d shares the bank without DummyOneBank", l)
				}
			}
			sameTokens(t, "one bank", DummyOneBank(cfg, 3), "a bank a layer", Dummy(cfg, 3))
		})
	}
}
