package tokenizer

import (
	"math/rand/v2"
	"reflect"
	"strings"
	"testing"
	"unicode"
	"unicode/utf8"
)

var knownPatterns = map[string]string{
	"deepseek-digits": deepseekDigits,
	"deepseek-cjk":    deepseekCJK,
	"deepseek-main":   deepseekMain,
	"glm-main":        glmMain,
	"gpt2":            gpt2Pattern,
}

func checkFast(t *testing.T, s string) {
	t.Helper()
	for name, p := range knownPatterns {
		rs, err := newRegexSplit(p)
		if err != nil {
			t.Fatal(err)
		}
		if rs.fast == nil {
			t.Fatalf("%s has no fast scanner", name)
		}
		in := s
		if name == "glm-main" {
			// regexp2's (?i) does not fold ſ to s as HF's Oniguruma does;
			// fast follows HF (checked by TestGoldenHF's texts)
			in = strings.ReplaceAll(s, "ſ", "x")
		}
		want := rs.splitRegexp(nil, in)
		got := rs.fast(nil, in)
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("%s on %q:\n fast   %q\n regexp %q", name, in, got, want)
		}
	}
}

// randomRunes draws from every Unicode class the patterns test.
func randomRunes(rng *rand.Rand, n int) string {
	var sb strings.Builder
	for k := 0; k < n; k++ {
		switch rng.IntN(6) {
		case 0:
			sb.WriteByte(byte(rng.IntN(128)))
		case 1:
			sb.WriteString([]string{" ", "  ", "\n", "\r", "\t", "'", "'S", "'ll", "'Re", "\u00a0", "\u3000", "\u0085"}[rng.IntN(12)])
		case 2, 3:
			r := rune(0x80 + rng.IntN(0x800))
			if k%2 == 1 {
				r = rune(0x3000 + rng.IntN(0x7000))
			}
			if !assigned(r) {
				r = 'y'
			}
			sb.WriteRune(r)
		default:
			r := rune(rng.IntN(0x20000))
			if !utf8.ValidRune(r) || !assigned(r) {
				r = 'x'
			}
			sb.WriteRune(r)
		}
	}
	return sb.String()
}

// assigned reports whether r has a category in Go's Unicode tables (15.0).
// HF's Oniguruma knows Unicode 16, so letters first assigned there are
// classed differently; random tests draw only from 15.0.
func assigned(r rune) bool {
	return unicode.In(r, unicode.L, unicode.M, unicode.N, unicode.P, unicode.S, unicode.Z, unicode.Cc, unicode.Cf, unicode.Co, unicode.Cs)
}

func TestFastScannersMatchRegexp(t *testing.T) {
	for _, s := range texts {
		checkFast(t, s)
	}
	for _, s := range randomTexts(3000, 21) {
		checkFast(t, s)
	}
	rng := rand.New(rand.NewPCG(3, 4))
	for i := 0; i < 5000; i++ {
		checkFast(t, randomRunes(rng, 1+rng.IntN(30)))
	}
}

func FuzzFastScanners(f *testing.F) {
	for _, s := range texts {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		if !utf8.ValidString(s) {
			s = strings.ToValidUTF8(s, "\uFFFD")
		}
		checkFast(t, s)
	})
}

// TestFastPathUsed guards against a pattern typo silently dropping to the
// slow engine.
func TestFastPathUsed(t *testing.T) {
	for _, c := range synthCases {
		tk := mustParse(t, buildCase(t, c))
		for _, sp := range tk.pretok {
			switch x := sp.(type) {
			case *regexSplit:
				if x.fast == nil {
					t.Errorf("%s: a Split has no fast scanner", c.name)
				}
			case byteLevelSplit:
				if x.re != nil && x.re.fast == nil {
					t.Errorf("%s: ByteLevel regex has no fast scanner", c.name)
				}
			}
		}
	}
}
