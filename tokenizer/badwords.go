package tokenizer

import (
	"strings"
	"unicode"

	"github.com/cockroachdb/errors"
)

// BadWords turns vLLM's bad_words into the token id sequences its sampler
// blocks, as vLLM's SamplingParams.update_from_tokenizer does: each word,
// leading spaces removed, is encoded without special tokens as it is and
// with one leading space; the spaced form is kept too when it starts with
// another id and has as many ids (a word in the middle of a text). More
// than limit sequences is an error (vLLM's VLLM_MAX_NUM_BAD_WORDS).
func (t *Tokenizer) BadWords(words []string, limit int) ([][]int, error) {
	var out [][]int
	add := func(ids []int) error {
		out = append(out, ids)
		if len(out) > limit {
			return errors.WithHint(errors.Newf("too many bad words after tokenization: %d; the max number is %d", len(out), limit),
				"send fewer bad_words (each word can become two token sequences)")
		}
		return nil
	}
	for _, word := range words {
		w := strings.TrimLeftFunc(word, unicode.IsSpace)
		plain, err := t.Encode(w, false)
		if err != nil {
			return nil, err
		}
		if len(plain) == 0 {
			return nil, errors.WithHint(errors.Newf("bad_words entries must tokenize to at least one token; %q does not", word),
				"leave out entries that are only whitespace")
		}
		spaced, err := t.Encode(" "+w, false)
		if err != nil {
			return nil, err
		}
		if err := add(plain); err != nil {
			return nil, err
		}
		if len(spaced) > 0 && spaced[0] != plain[0] && len(spaced) == len(plain) {
			if err := add(spaced); err != nil {
				return nil, err
			}
		}
	}
	return out, nil
}
