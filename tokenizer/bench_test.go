package tokenizer

import (
	"strings"
	"testing"
)

func benchText() string {
	return strings.Repeat(strings.Join(texts, "\n"), 4)
}

func benchEncode(b *testing.B, c synthCase) {
	tk := mustParse(b, buildCase(b, c))
	text := benchText()
	b.SetBytes(int64(len(text)))
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		if _, err := tk.Encode(text, false); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkEncodeDeepSeek(b *testing.B) { benchEncode(b, synthCases[0]) }
func BenchmarkEncodeGLM(b *testing.B)      { benchEncode(b, synthCases[1]) }

func BenchmarkDecoderAdd(b *testing.B) {
	tk := mustParse(b, buildCase(b, synthCases[0]))
	ids, _ := tk.Encode(benchText(), false)
	b.ReportAllocs()
	b.ResetTimer()
	n := 0
	for b.Loop() {
		d := tk.NewDecoder()
		for _, id := range ids {
			n += len(d.Add(id))
		}
		n += len(d.Flush())
	}
	b.ReportMetric(float64(len(ids)*b.N)/b.Elapsed().Seconds(), "tokens/s")
}

func BenchmarkDecode(b *testing.B) {
	tk := mustParse(b, buildCase(b, synthCases[0]))
	ids, _ := tk.Encode(benchText(), false)
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		_ = tk.Decode(ids, false)
	}
	b.ReportMetric(float64(len(ids)*b.N)/b.Elapsed().Seconds(), "tokens/s")
}
