package gpu

import (
	"bytes"
	"strings"
	"testing"

	"github.com/tilert-go/tilert/cuda"
	"github.com/tilert-go/tilert/engine"
	"github.com/tilert-go/tilert/engine/internal/enginetest"
)

// TestEmuFastPrefill / TestGPUFastPrefill: engine.PrefillFast is the
// one-part prefill the environment switches give (TILERT_GPU_GEMM_SPLITS=1
// TILERT_GPU_MLA_PREFILL=6), chosen per engine: the same first token and
// cache bytes, bit for bit, as an engine built with those switches pinned
// (on the GPU mla_prefill_wg2 ran); different bytes from the float32
// prefill of the same prompt (the option has an effect); refused in exact
// mode, and accepted by name only.
func TestEmuFastPrefill(t *testing.T) { testFastPrefill(t, onEmu) }
func TestGPUFastPrefill(t *testing.T) { testFastPrefill(t, onGPU) }

func testFastPrefill(t *testing.T, kind deviceKind) {
	if kind == onGPU {
		gpuDevice(t)
	}
	if gemmSplitsSet || mlaPrefillModeSet {
		t.Skip("TILERT_GPU_GEMM_SPLITS / TILERT_GPU_MLA_PREFILL set: they win over the fast prefill's choice")
	}
	for _, pr := range enginetest.Presets {
		t.Run(pr, func(t *testing.T) {
			w, src := hfSourceOf(t, enginetest.PresetDir(t, pr))
			prompt := genCases(w.Config().VocabSize)[1].prompt
			run := func(opts engine.Options) (int, []byte) {
				t.Helper()
				opts.MaxSeqLen, opts.Slots = maxSeq, 1
				e := newTestEngine(t, kind, src, opts)
				tok, err := e.Prefill(0, prompt, engine.Params{})
				if err != nil {
					t.Fatalf("%+v", err)
				}
				_, segs, err := e.Export(0)
				if err != nil {
					t.Fatal(err)
				}
				var b bytes.Buffer
				for _, s := range segs {
					b.Write(s.Data)
				}
				return tok, b.Bytes()
			}
			wg2 := wg2Launches.Load()
			fastTok, fast := run(engine.Options{Prefill: engine.PrefillFast})
			if i := gpuInfo(kind, t); i.CCMajor == 9 && i.CCMinor == 0 && wg2Launches.Load() == wg2 {
				t.Errorf("the fast prefill did not run mla_prefill_wg2 on this 9.0 device")
			}
			f32Tok, f32 := run(engine.Options{})
			oldSplits, oldMode := gemmSplits, mlaPrefillMode
			gemmSplits, mlaPrefillMode = 1, 6
			pinTok, pinned := run(engine.Options{})
			gemmSplits, mlaPrefillMode = oldSplits, oldMode
			if fastTok != pinTok || !bytes.Equal(fast, pinned) {
				t.Errorf("fast prefill: first token %d, caches differ from the pinned one-part switches' (token %d) in %d bytes",
					fastTok, pinTok, countDiff(fast, pinned))
			}
			d := countDiff(fast, f32)
			t.Logf("%s: fast vs float32 prefill: %d of %d cache bytes differ (first tokens %d / %d)", pr, d, len(f32), fastTok, f32Tok)
			if d == 0 {
				t.Errorf("the fast prefill left the float32 prefill's caches bit for bit: the option did nothing")
			}
		})
	}
	if kind == onGPU {
		return
	}
	_, src := hfSourceOf(t, enginetest.PresetDir(t, enginetest.Presets[0]))
	if _, err := NewEmulated(src, engine.Options{Mode: engine.ModeExact, Prefill: engine.PrefillFast, MaxSeqLen: maxSeq}); err == nil ||
		!strings.Contains(err.Error(), "exact mode") {
		t.Errorf("exact mode with the fast prefill: %v, want a refusal", err)
	}
	if _, err := NewEmulated(src, engine.Options{Prefill: "bf16", MaxSeqLen: maxSeq}); err == nil || !strings.Contains(err.Error(), "prefill precision") {
		t.Errorf("prefill precision bf16: %v, want a refusal naming it", err)
	}
}

func countDiff(a, b []byte) int {
	n := max(len(a), len(b)) - min(len(a), len(b))
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			n++
		}
	}
	return n
}

// gpuInfo is the test GPU's description (zero on the emulator).
func gpuInfo(kind deviceKind, t *testing.T) cuda.DeviceInfo {
	if kind != onGPU {
		return cuda.DeviceInfo{}
	}
	return gpuDevice(t).Info
}
