package tokenizer

import (
	"encoding/json"
	"unicode"
	"unicode/utf8"

	"github.com/cockroachdb/errors"
	"github.com/dlclark/regexp2"
)

// gpt2Pattern is the split HF's ByteLevel pre-tokenizer applies when
// use_regex is true.
const gpt2Pattern = `'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+`

// splitter cuts one pre-token into smaller ones, appending them to dst.
type splitter interface {
	split(dst []string, s string) []string
}

// regexSplit is HF's Split with behavior Isolated and invert false: every
// match and every gap between matches becomes its own piece.
type regexSplit struct {
	re *regexp2.Regexp
	// fast, when set, is a hand-written scanner proven equal to re on the
	// patterns real checkpoints ship; it avoids regexp2's per-match cost.
	fast func(dst []string, s string) []string
}

func newRegexSplit(pattern string) (*regexSplit, error) {
	re, err := regexp2.Compile(pattern, regexp2.None)
	if err != nil {
		return nil, errors.Wrapf(err, "pre-tokenizer regex %q", pattern)
	}
	return &regexSplit{re: re, fast: fastScanner(pattern)}, nil
}

func (r *regexSplit) split(dst []string, s string) []string {
	if r.fast != nil {
		return r.fast(dst, s)
	}
	return r.splitRegexp(dst, s)
}

func (r *regexSplit) splitRegexp(dst []string, s string) []string {
	if s == "" {
		return dst
	}
	runes := []rune(s)
	// byte offset of every rune index, plus the end
	offs := make([]int, 0, len(runes)+1)
	for i := range s {
		offs = append(offs, i)
	}
	offs = append(offs, len(s))
	prev := 0
	m, err := r.re.FindRunesMatch(runes)
	for err == nil && m != nil {
		start, end := m.Index, m.Index+m.Length
		if start > prev {
			dst = append(dst, s[offs[prev]:offs[start]])
		}
		if end > start {
			dst = append(dst, s[offs[start]:offs[end]])
		}
		prev = end
		m, err = r.re.FindNextMatch(m)
	}
	if prev < len(runes) {
		dst = append(dst, s[offs[prev]:])
	}
	return dst
}

// digitsSplit is HF's Digits pre-tokenizer (Rust char::is_numeric = \p{N}).
type digitsSplit struct{ individual bool }

func (d digitsSplit) split(dst []string, s string) []string {
	start := 0
	inDigits := false
	for i, r := range s {
		isD := unicode.IsNumber(r)
		if d.individual && isD {
			if i > start {
				dst = append(dst, s[start:i])
			}
			end := i + utf8.RuneLen(r)
			dst = append(dst, s[i:end])
			start = end
			continue
		}
		if !d.individual && i > start && isD != inDigits {
			dst = append(dst, s[start:i])
			start = i
		}
		inDigits = isD
	}
	if start < len(s) {
		dst = append(dst, s[start:])
	}
	return dst
}

// byteLevelSplit is the splitting half of HF's ByteLevel pre-tokenizer; the
// byte mapping itself happens inside the BPE step, which works on bytes.
type byteLevelSplit struct {
	addPrefixSpace bool
	re             *regexSplit // nil when use_regex is false
}

func (b byteLevelSplit) split(dst []string, s string) []string {
	if b.addPrefixSpace && (len(s) == 0 || s[0] != ' ') {
		s = " " + s
	}
	if b.re == nil {
		if s != "" {
			dst = append(dst, s)
		}
		return dst
	}
	return b.re.split(dst, s)
}

// parsePreTokenizer flattens the pre_tokenizer tree into an ordered list of
// splitters. ByteLevel must come last: anything after it would see the
// byte-level alphabet, which the BPE step here does not model.
func parsePreTokenizer(raw json.RawMessage) ([]splitter, error) {
	if isNull(raw) {
		return nil, errors.WithHint(errors.New("tokenizer.json has no pre_tokenizer"),
			"only byte-level BPE tokenizers (pre_tokenizer ByteLevel) are supported")
	}
	var out []splitter
	sawByteLevel := false
	var walk func(raw json.RawMessage, path string) error
	walk = func(raw json.RawMessage, path string) error {
		var p preTokJSON
		if err := json.Unmarshal(raw, &p); err != nil {
			return errors.Wrapf(err, "%s", path)
		}
		if sawByteLevel {
			return errors.Newf("%s: pre-tokenizer %q after ByteLevel is not supported", path, p.Type)
		}
		switch p.Type {
		case "Sequence":
			for i, sub := range p.Pretokenizers {
				if err := walk(sub, path+".pretokenizers["+itoa(i)+"]"); err != nil {
					return err
				}
			}
		case "Split":
			if p.Behavior != "Isolated" || p.Invert {
				return errors.Newf("%s: Split behavior %q invert %v is not supported (only Isolated, invert false)", path, p.Behavior, p.Invert)
			}
			if p.Pattern == nil {
				return errors.Newf("%s: Split without pattern", path)
			}
			var pat string
			switch {
			case p.Pattern.Regex != nil:
				pat = *p.Pattern.Regex
			case p.Pattern.String != nil:
				pat = regexp2.Escape(*p.Pattern.String)
			default:
				return errors.Newf("%s: Split pattern is neither Regex nor String", path)
			}
			rs, err := newRegexSplit(pat)
			if err != nil {
				return errors.Wrapf(err, "%s", path)
			}
			out = append(out, rs)
		case "Digits":
			out = append(out, digitsSplit{individual: p.IndividualDigits})
		case "ByteLevel":
			bl := byteLevelSplit{addPrefixSpace: p.AddPrefixSpace}
			if p.UseRegex == nil || *p.UseRegex { // HF's default is true
				rs, err := newRegexSplit(gpt2Pattern)
				if err != nil {
					return err
				}
				bl.re = rs
			}
			out = append(out, bl)
			sawByteLevel = true
		default:
			return errors.Newf("%s: pre-tokenizer type %q is not supported", path, p.Type)
		}
		return nil
	}
	if err := walk(raw, "pre_tokenizer"); err != nil {
		return nil, err
	}
	if !sawByteLevel {
		return nil, errors.WithHint(errors.New("pre_tokenizer has no ByteLevel step"),
			"only byte-level BPE tokenizers are supported")
	}
	return out, nil
}

func itoa(i int) string {
	if i == 0 {
		return "0"
	}
	var b [20]byte
	n := len(b)
	for i > 0 {
		n--
		b[n] = byte('0' + i%10)
		i /= 10
	}
	return string(b[n:])
}
