package tokenizer

import (
	"bytes"
	_ "embed"
	"encoding/json"
	"math/rand/v2"
	"slices"
	"strings"

	"github.com/cockroachdb/errors"
)

//go:embed corpus.txt
var synthCorpus string

// Pre-tokenizer patterns of the real checkpoints, reproduced for the
// synthetic tokenizers so they exercise the same code paths.
const (
	deepseekDigits = `\p{N}{1,3}`
	deepseekCJK    = "[一-龥぀-ゟ゠-ヿ]+"
	deepseekMain   = "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+| ?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+"
	glmMain        = `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`
)

// Style picks which real tokenizer's pre-tokenizer a synthetic one copies.
type Style string

const (
	StyleDeepSeek Style = "deepseek" // Split digits{1,3}, Split CJK, Split main, ByteLevel(use_regex=false)
	StyleGLM      Style = "glm"      // Split llama3-like pattern, ByteLevel(use_regex=false)
)

// SyntheticOptions describes a synthetic tokenizer.
type SyntheticOptions struct {
	VocabSize int      // total ids: 256 bytes + merges + specials
	Specials  []string // added special tokens, given the last ids in order
	Seed      int64
	Style     Style // "" picks GLM when Specials has "[gMASK]", else DeepSeek
}

// BuildSynthetic returns a tokenizer.json for a deterministic byte-level BPE
// tokenizer of vocabSize ids: the 256 byte tokens, merges learned on an
// embedded corpus (weighted by seed), then specials. The pre-tokenizer
// copies GLM's when specials contain "[gMASK]", DeepSeek-V3's otherwise.
func BuildSynthetic(vocabSize int, specials []string, seed int64) ([]byte, error) {
	return BuildSyntheticWith(SyntheticOptions{VocabSize: vocabSize, Specials: specials, Seed: seed})
}

// BuildSyntheticWith is BuildSynthetic with every option.
func BuildSyntheticWith(o SyntheticOptions) ([]byte, error) {
	style := o.Style
	if style == "" {
		style = StyleDeepSeek
		if slices.Contains(o.Specials, "[gMASK]") {
			style = StyleGLM
		}
	}
	var patterns []string
	switch style {
	case StyleDeepSeek:
		patterns = []string{deepseekDigits, deepseekCJK, deepseekMain}
	case StyleGLM:
		patterns = []string{glmMain}
	default:
		return nil, errors.Newf("synthetic tokenizer: unknown style %q", style)
	}
	seen := map[string]bool{}
	for _, s := range o.Specials {
		if s == "" || seen[s] {
			return nil, errors.Newf("synthetic tokenizer: special token %q is empty or repeated", s)
		}
		seen[s] = true
	}
	nMerges := o.VocabSize - 256 - len(o.Specials)
	if nMerges < 0 {
		return nil, errors.Newf("synthetic tokenizer: vocab size %d is below 256 byte tokens + %d specials", o.VocabSize, len(o.Specials))
	}
	var pretok []splitter
	for _, p := range patterns {
		rs, err := newRegexSplit(p)
		if err != nil {
			return nil, err
		}
		pretok = append(pretok, rs)
	}
	pretok = append(pretok, byteLevelSplit{})
	words := synthWords(pretok, o.Seed)
	toks, merges, err := trainBPE(words, nMerges)
	if err != nil {
		return nil, errors.Wrapf(err, "synthetic tokenizer of vocab size %d", o.VocabSize)
	}
	return writeTokenizerJSON(toks, merges, o.Specials, patterns), nil
}

// synthWords pre-tokenises the corpus, each line weighted 1..4 by the seed,
// plus seeded compounds of corpus words so that large vocabularies still
// find merges to learn.
func synthWords(pretok []splitter, seed int64) map[string]int {
	rng := rand.New(rand.NewPCG(uint64(seed), 0x746f6b656e697a65))
	t := &Tokenizer{pretok: pretok}
	counts := map[string]int{}
	var letters []string
	for _, line := range strings.SplitAfter(synthCorpus, "\n") {
		w := 1 + rng.IntN(4)
		for _, word := range t.preTokenize(nil, line) {
			counts[word] += w
			if len(word) > 3 && isASCIILetters(strings.TrimPrefix(word, " ")) {
				letters = append(letters, strings.TrimPrefix(word, " "))
			}
		}
	}
	for i := 0; i < 4000; i++ {
		a := letters[rng.IntN(len(letters))]
		b := letters[rng.IntN(len(letters))]
		counts[" "+a+b]++
	}
	return counts
}

func isASCIILetters(s string) bool {
	for i := 0; i < len(s); i++ {
		c := s[i] | 0x20
		if c < 'a' || c > 'z' {
			return false
		}
	}
	return s != ""
}

type trainWord struct {
	syms  []int32
	count int
}

// trainBPE learns n merges: each step merges the most frequent adjacent
// pair (ties: the smallest ids) everywhere. Token i < 256 is byte i.
func trainBPE(counts map[string]int, n int) (toks [][]byte, merges [][2]int32, err error) {
	keys := make([]string, 0, len(counts))
	for k := range counts {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	words := make([]trainWord, len(keys))
	for i, k := range keys {
		s := make([]int32, len(k))
		for j := 0; j < len(k); j++ {
			s[j] = int32(k[j])
		}
		words[i] = trainWord{s, counts[k]}
	}
	for b := 0; b < 256; b++ {
		toks = append(toks, []byte{byte(b)})
	}
	index := map[string]int32{}
	for i, t := range toks {
		index[string(t)] = int32(i)
	}
	pairs := map[uint64]int{}
	for _, w := range words {
		for j := 0; j+1 < len(w.syms); j++ {
			pairs[pairKey(w.syms[j], w.syms[j+1])] += w.count
		}
	}
	for len(toks)-256 < n {
		var best uint64
		bestN := 0
		for k, c := range pairs {
			if c > bestN || (c == bestN && k < best) {
				best, bestN = k, c
			}
		}
		if bestN == 0 {
			return nil, nil, errors.Newf("the embedded corpus ran out of pairs after %d new tokens (%d wanted)", len(toks)-256, n)
		}
		a, b := int32(best>>32), int32(uint32(best))
		merged := string(toks[a]) + string(toks[b])
		// a string already made by another pair gets a second merge rule
		// but no new vocab entry, as in HF's trainer
		id, ok := index[merged]
		if !ok {
			id = int32(len(toks))
			toks = append(toks, []byte(merged))
			index[merged] = id
		}
		merges = append(merges, [2]int32{a, b})
		for wi := range words {
			w := &words[wi]
			if !hasPair(w.syms, a, b) {
				continue
			}
			for j := 0; j+1 < len(w.syms); j++ {
				pairs[pairKey(w.syms[j], w.syms[j+1])] -= w.count
			}
			out := w.syms[:0]
			for j := 0; j < len(w.syms); j++ {
				if j+1 < len(w.syms) && w.syms[j] == a && w.syms[j+1] == b {
					out = append(out, id)
					j++
				} else {
					out = append(out, w.syms[j])
				}
			}
			w.syms = out
			for j := 0; j+1 < len(w.syms); j++ {
				pairs[pairKey(w.syms[j], w.syms[j+1])] += w.count
			}
		}
		for k, c := range pairs {
			if c == 0 {
				delete(pairs, k)
			}
		}
	}
	return toks, merges, nil
}

func hasPair(s []int32, a, b int32) bool {
	for j := 0; j+1 < len(s); j++ {
		if s[j] == a && s[j+1] == b {
			return true
		}
	}
	return false
}

// writeTokenizerJSON writes the file by hand so the bytes (key order, vocab
// order by id) never depend on map iteration.
func writeTokenizerJSON(toks [][]byte, merges [][2]int32, specials, patterns []string) []byte {
	var w bytes.Buffer
	str := func(s string) {
		var b bytes.Buffer
		enc := json.NewEncoder(&b)
		enc.SetEscapeHTML(false)
		_ = enc.Encode(s) // a string never fails
		w.Write(bytes.TrimRight(b.Bytes(), "\n"))
	}
	bl := func(t []byte) string { return byteLevelString(t) }
	w.WriteString("{\n  \"version\": \"1.0\",\n  \"truncation\": null,\n  \"padding\": null,\n  \"added_tokens\": [")
	for i, s := range specials {
		if i > 0 {
			w.WriteString(",")
		}
		w.WriteString("\n    {\"id\": " + itoa(len(toks)+i) + ", \"content\": ")
		str(s)
		w.WriteString(", \"single_word\": false, \"lstrip\": false, \"rstrip\": false, \"normalized\": false, \"special\": true}")
	}
	w.WriteString("\n  ],\n  \"normalizer\": null,\n  \"pre_tokenizer\": {\n    \"type\": \"Sequence\",\n    \"pretokenizers\": [")
	for _, p := range patterns {
		w.WriteString("\n      {\"type\": \"Split\", \"pattern\": {\"Regex\": ")
		str(p)
		w.WriteString("}, \"behavior\": \"Isolated\", \"invert\": false},")
	}
	w.WriteString("\n      {\"type\": \"ByteLevel\", \"add_prefix_space\": false, \"trim_offsets\": true, \"use_regex\": false}\n    ]\n  },\n")
	w.WriteString("  \"post_processor\": null,\n  \"decoder\": {\"type\": \"ByteLevel\", \"add_prefix_space\": true, \"trim_offsets\": true, \"use_regex\": true},\n")
	w.WriteString("  \"model\": {\n    \"type\": \"BPE\",\n    \"dropout\": null,\n    \"unk_token\": null,\n    \"continuing_subword_prefix\": null,\n    \"end_of_word_suffix\": null,\n    \"fuse_unk\": false,\n    \"byte_fallback\": false,\n    \"ignore_merges\": false,\n    \"vocab\": {")
	for i, t := range toks {
		if i > 0 {
			w.WriteString(",")
		}
		w.WriteString("\n      ")
		str(bl(t))
		w.WriteString(": " + itoa(i))
	}
	w.WriteString("\n    },\n    \"merges\": [")
	for i, m := range merges {
		if i > 0 {
			w.WriteString(",")
		}
		w.WriteString("\n      [")
		str(bl(toks[m[0]]))
		w.WriteString(", ")
		str(bl(toks[m[1]]))
		w.WriteString("]")
	}
	w.WriteString("\n    ]\n  }\n}\n")
	return w.Bytes()
}
