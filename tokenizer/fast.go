package tokenizer

import (
	"strings"
	"sync"
	"unicode"
	"unicode/utf8"
)

// Hand-written scanners for the pre-tokenizer regexes that real checkpoints
// ship. Each one reproduces the backtracking regex's leftmost-first choice
// among alternatives; TestFastScannersMatchRegexp and FuzzFastScanners hold
// them to the general regex engine, which the HF cross-check holds to HF.

// character classes the patterns use
const (
	cL    = 1 << iota // \p{L}
	cN                // \p{N}
	cP                // \p{P}
	cS                // \p{S}
	cM                // \p{M}
	cSp               // \s (Unicode White_Space)
	cCRLF             // \r or \n
	cAP               // ASCII punctuation of DeepSeek's first alternative
	cAL               // [A-Za-z]
)

var asciiClass [utf8.RuneSelf]uint16

func init() {
	for r := rune(0); r < utf8.RuneSelf; r++ {
		asciiClass[r] = slowClass(r)
	}
}

func slowClass(r rune) uint16 {
	var c uint16
	if unicode.IsLetter(r) {
		c |= cL
	}
	if unicode.IsNumber(r) {
		c |= cN
	}
	if unicode.IsPunct(r) {
		c |= cP
	}
	if unicode.IsSymbol(r) {
		c |= cS
	}
	if unicode.IsMark(r) {
		c |= cM
	}
	if unicode.IsSpace(r) {
		c |= cSp
	}
	if r == '\r' || r == '\n' {
		c |= cCRLF
	}
	if r < utf8.RuneSelf && strings.ContainsRune("!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~", r) {
		c |= cAP
	}
	if (r >= 'a' && r <= 'z') || (r >= 'A' && r <= 'Z') {
		c |= cAL
	}
	return c
}

// at returns the class and size of the rune at i (0, 0 at the end).
func at(s string, i int) (uint16, int) {
	if i >= len(s) {
		return 0, 0
	}
	if c := s[i]; c < utf8.RuneSelf {
		return asciiClass[c], 1
	}
	r, n := utf8.DecodeRuneInString(s[i:])
	if r < 0x10000 {
		bmpOnce.Do(initBMP)
		return bmpClass[r], n
	}
	return slowClass(r), n
}

// bmpClass caches slowClass for the Basic Multilingual Plane (128 KiB),
// built on first use because every lookup otherwise walks several tables.
var (
	bmpOnce  sync.Once
	bmpClass []uint16
)

func initBMP() {
	t := make([]uint16, 0x10000)
	for r := range t {
		t[r] = slowClass(rune(r))
	}
	bmpClass = t
}

// run returns the end of the run of runes from i whose class has any bit of mask.
func run(s string, i int, mask uint16) int {
	for i < len(s) {
		c, n := at(s, i)
		if c&mask == 0 {
			break
		}
		i += n
	}
	return i
}

// runMax is run limited to max runes.
func runMax(s string, i int, mask uint16, max int) int {
	for k := 0; k < max && i < len(s); k++ {
		c, n := at(s, i)
		if c&mask == 0 {
			break
		}
		i += n
	}
	return i
}

// matcher returns the end of a match starting at i, or -1.
type matcher func(s string, i int) int

// scanWith turns a matcher into an Isolated split: matches and the gaps
// between them become pieces.
func scanWith(m matcher) func(dst []string, s string) []string {
	return func(dst []string, s string) []string {
		gap := 0
		for i := 0; i < len(s); {
			if e := m(s, i); e > i {
				if i > gap {
					dst = append(dst, s[gap:i])
				}
				dst = append(dst, s[i:e])
				i, gap = e, e
				continue
			}
			_, n := at(s, i)
			i += n
		}
		if gap < len(s) {
			dst = append(dst, s[gap:])
		}
		return dst
	}
}

// whitespace alternatives shared by all patterns:
// \s*[\r\n]+ | \s+(?!\S) | \s+   (crlf selects whether the first is present)
func matchSpace(s string, i int, crlf bool) int {
	c, _ := at(s, i)
	if c&cSp == 0 {
		return -1
	}
	end := i
	lastNL := -1 // end of the last CR/LF inside the run
	nRunes := 0
	prev := i
	for end < len(s) {
		c, n := at(s, end)
		if c&cSp == 0 {
			break
		}
		if c&cCRLF != 0 {
			lastNL = end + n
		}
		prev = end
		end += n
		nRunes++
	}
	if crlf && lastNL > 0 {
		// \s* backs off to the last CR/LF, which [\r\n]+ then takes alone
		return lastNL
	}
	if end == len(s) {
		return end
	}
	if nRunes > 1 { // leave the last space to prefix the next word
		return prev
	}
	return end // plain \s+
}

// `\p{N}{1,3}`
func matchDigits3(s string, i int) int {
	if e := runMax(s, i, cN, 3); e > i {
		return e
	}
	return -1
}

func isDeepSeekCJK(r rune) bool {
	return (r >= 0x4E00 && r <= 0x9FA5) || (r >= 0x3040 && r <= 0x309F) || (r >= 0x30A0 && r <= 0x30FF)
}

// `[一-龥぀-ゟ゠-ヿ]+`
func matchCJK(s string, i int) int {
	e := i
	for e < len(s) {
		r, n := utf8.DecodeRuneInString(s[e:])
		if !isDeepSeekCJK(r) {
			break
		}
		e += n
	}
	if e > i {
		return e
	}
	return -1
}

// DeepSeek-V3's main pattern:
// [ASCII punct][A-Za-z]+ | [^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+ | ?[\p{P}\p{S}]+[\r\n]* | whitespace
func matchDeepSeek(s string, i int) int {
	c, n := at(s, i)
	c2, _ := at(s, i+n)
	if c&cAP != 0 && c2&cAL != 0 {
		return run(s, i+n, cAL)
	}
	if c&(cCRLF|cL|cP|cS) == 0 && c2&(cL|cM) != 0 {
		return run(s, i+n, cL|cM)
	}
	if c&(cL|cM) != 0 {
		return run(s, i, cL|cM)
	}
	if s[i] == ' ' && c2&(cP|cS) != 0 {
		return run(s, run(s, i+1, cP|cS), cCRLF)
	}
	if c&(cP|cS) != 0 {
		return run(s, run(s, i, cP|cS), cCRLF)
	}
	return matchSpace(s, i, true)
}

// GLM-4 / Llama-3 pattern:
// (?i:'s|'t|'re|'ve|'m|'ll|'d) | [^\r\n\p{L}\p{N}]?\p{L}+ | \p{N}{1,3} |
//
//	?[^\s\p{L}\p{N}]+[\r\n]* | whitespace
func matchGLM(s string, i int) int {
	if s[i] == '\'' {
		if e := contraction(s, i+1, true); e > 0 {
			return e
		}
	}
	c, n := at(s, i)
	c2, _ := at(s, i+n)
	if c&(cCRLF|cL|cN) == 0 && c2&cL != 0 {
		return run(s, i+n, cL)
	}
	if c&cL != 0 {
		return run(s, i, cL)
	}
	if c&cN != 0 {
		return runMax(s, i, cN, 3)
	}
	if e := matchOther(s, i, c, c2); e > 0 {
		return run(s, e, cCRLF)
	}
	return matchSpace(s, i, true)
}

// GPT-2 pattern (ByteLevel use_regex):
// 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
func matchGPT2(s string, i int) int {
	if s[i] == '\'' {
		if e := contraction(s, i+1, false); e > 0 {
			return e
		}
	}
	c, n := at(s, i)
	c2, _ := at(s, i+n)
	for _, k := range [2]uint16{cL, cN} {
		if s[i] == ' ' && c2&k != 0 {
			return run(s, i+1, k)
		}
		if c&k != 0 {
			return run(s, i, k)
		}
	}
	if e := matchOther(s, i, c, c2); e > 0 {
		return e
	}
	return matchSpace(s, i, false)
}

// ` ?[^\s\p{L}\p{N}]+`
func matchOther(s string, i int, c, c2 uint16) int {
	const not = cSp | cL | cN
	if s[i] == ' ' && c2&not == 0 && i+1 < len(s) {
		return runNot(s, i+1, not)
	}
	if c&not == 0 {
		return runNot(s, i, not)
	}
	return -1
}

func runNot(s string, i int, not uint16) int {
	for i < len(s) {
		c, n := at(s, i)
		if c&not != 0 {
			break
		}
		i += n
	}
	return i
}

// contraction matches s|t|re|ve|m|ll|d after an apostrophe; fold makes it
// case-insensitive the way the regex engine's (?i) does.
func contraction(s string, i int, fold bool) int {
	lower := func(k int) (byte, int) {
		if k >= len(s) {
			return 0, 0
		}
		b := s[k]
		if b >= utf8.RuneSelf {
			return 0, 0
		}
		if fold && b >= 'A' && b <= 'Z' {
			b += 'a' - 'A'
		}
		return b, 1
	}
	a, _ := lower(i)
	// Oniguruma's (?i) folds U+017F LATIN SMALL LETTER LONG S to s (HF
	// splits "'ſa" as "'ſ" + "a"); regexp2 does not, so this is HF's rule.
	if fold && strings.HasPrefix(s[i:], "ſ") {
		return i + len("ſ")
	}
	switch a {
	case 's', 't', 'm', 'd':
		return i + 1
	case 'r', 'v':
		if b, _ := lower(i + 1); b == 'e' {
			return i + 2
		}
	case 'l':
		if b, _ := lower(i + 1); b == 'l' {
			return i + 2
		}
	}
	return -1
}

// normPattern writes literal CR/LF as regex escapes so a pattern matches
// its known form however the JSON spelled it.
func normPattern(p string) string {
	return strings.NewReplacer("\r", `\r`, "\n", `\n`).Replace(p)
}

var knownScanners = map[string]matcher{
	normPattern(deepseekDigits): matchDigits3,
	normPattern(deepseekCJK):    matchCJK,
	normPattern(deepseekMain):   matchDeepSeek,
	normPattern(glmMain):        matchGLM,
	normPattern(gpt2Pattern):    matchGPT2,
}

// fastScanner returns a hand-written scanner for patterns known to be used
// by supported checkpoints, or nil to use the general regex engine.
func fastScanner(pattern string) func(dst []string, s string) []string {
	if disableFast {
		return nil
	}
	if m, ok := knownScanners[normPattern(pattern)]; ok {
		return scanWith(m)
	}
	return nil
}

// disableFast forces the regex engine (tests and benchmarks compare both).
var disableFast = false
