package cpu

import (
	"fmt"
	"testing"

	"github.com/tilert-go/tilert/engine"
	"github.com/tilert-go/tilert/engine/internal/enginetest"
)

// BenchmarkDecode measures CPU decode tokens/s: each iteration is one Step
// over all slots, with sequences restarted (untimed) every 128 tokens from a
// 64-token prompt. Run: go test ./engine/cpu -run '^$' -bench Decode
func BenchmarkDecode(b *testing.B) {
	for _, pr := range enginetest.Presets {
		for _, tc := range []struct {
			mode  engine.Options
			slots int
		}{
			{engine.Options{Mode: engine.ModeExact}, 1},
			{engine.Options{Mode: engine.ModeServing}, 1},
			{engine.Options{Mode: engine.ModeServing, MTP: true}, 1},
			{engine.Options{Mode: engine.ModeServing}, 4},
		} {
			name := fmt.Sprintf("%s/%s/mtp=%v/slots=%d", pr, modeName(tc.mode), tc.mode.MTP, tc.slots)
			b.Run(name, func(b *testing.B) {
				o := tc.mode
				o.Slots, o.MaxSeqLen = tc.slots, 256
				e := newEngine(b, pr, o)
				ids := make([]int, tc.slots)
				start := func() {
					for i := range ids {
						ids[i] = i
						e.Release(i)
						first, err := e.Prefill(i, enginetest.Prompt(64, 1000, i), engine.Params{})
						if err != nil {
							b.Fatal(err)
						}
						if _, err := e.Start(i, first, engine.Params{MaxTokens: 128}); err != nil {
							b.Fatal(err)
						}
					}
				}
				start()
				tokens := 0
				b.ReportAllocs()
				b.ResetTimer()
				for i := 0; i < b.N; i++ {
					res, err := e.Step(ids)
					if err != nil {
						b.Fatal(err)
					}
					done := false
					for _, r := range res {
						tokens += len(r.Tokens)
						done = done || r.Finish != engine.FinishNone
					}
					if done {
						b.StopTimer()
						start()
						b.StartTimer()
					}
				}
				b.ReportMetric(float64(tokens)/b.Elapsed().Seconds(), "tokens/s")
				if st := e.Stats(); st.DraftTokens > 0 {
					b.ReportMetric(st.AcceptRate(), "accept")
				}
			})
		}
	}
}
