package tokenizer

import (
	"unicode"
	"unicode/utf8"
)

// addedMatcher finds added tokens in text the way HF's AddedVocabulary does:
// leftmost-longest, honouring lstrip/rstrip/single_word.
type addedMatcher struct {
	root  *trieNode
	first [256]bool // bytes that start some token: most positions skip the trie
}

type trieNode struct {
	next map[byte]*trieNode
	tok  *addedToken // token ending here
}

type addedToken struct {
	id                         int
	content                    string
	special, normalized        bool
	singleWord, lstrip, rstrip bool
}

func newAddedMatcher(toks []*addedToken) *addedMatcher {
	if len(toks) == 0 {
		return nil
	}
	m := &addedMatcher{root: &trieNode{}}
	for _, t := range toks {
		if t.content == "" {
			continue
		}
		m.first[t.content[0]] = true
		n := m.root
		for i := 0; i < len(t.content); i++ {
			if n.next == nil {
				n.next = map[byte]*trieNode{}
			}
			c := n.next[t.content[i]]
			if c == nil {
				c = &trieNode{}
				n.next[t.content[i]] = c
			}
			n = c
		}
		n.tok = t
	}
	return m
}

// segment is a piece of input: either an added token (id >= 0) or plain
// text to be pre-tokenised (id < 0).
type segment struct {
	text string
	id   int
}

// split cuts s into plain-text and added-token segments.
func (m *addedMatcher) split(dst []segment, s string) []segment {
	if m == nil {
		return append(dst, segment{s, -1})
	}
	plainStart := 0
	i := 0
	for i < len(s) {
		if !m.first[s[i]] {
			i++
			continue
		}
		// longest token starting at i
		var best *addedToken
		n := m.root
		for j := i; j < len(s); j++ {
			n = n.next[s[j]]
			if n == nil {
				break
			}
			if n.tok != nil && m.accept(n.tok, s, i, j+1) {
				best = n.tok
			}
		}
		if best == nil {
			i++
			continue
		}
		start, end := i, i+len(best.content)
		if best.lstrip {
			for start > plainStart {
				r, sz := utf8.DecodeLastRuneInString(s[plainStart:start])
				if !unicode.IsSpace(r) {
					break
				}
				start -= sz
			}
		}
		if best.rstrip {
			for end < len(s) {
				r, sz := utf8.DecodeRuneInString(s[end:])
				if !unicode.IsSpace(r) {
					break
				}
				end += sz
			}
		}
		if start > plainStart {
			dst = append(dst, segment{s[plainStart:start], -1})
		}
		dst = append(dst, segment{s[start:end], best.id})
		plainStart, i = end, end
	}
	if plainStart < len(s) {
		dst = append(dst, segment{s[plainStart:], -1})
	}
	return dst
}

// accept applies single_word: the match may not touch word characters.
func (m *addedMatcher) accept(t *addedToken, s string, start, end int) bool {
	if !t.singleWord {
		return true
	}
	if start > 0 {
		r, _ := utf8.DecodeLastRuneInString(s[:start])
		if isWordChar(r) {
			return false
		}
	}
	if end < len(s) {
		r, _ := utf8.DecodeRuneInString(s[end:])
		if isWordChar(r) {
			return false
		}
	}
	return true
}

func isWordChar(r rune) bool {
	return r == '_' || unicode.IsLetter(r) || unicode.IsNumber(r)
}
