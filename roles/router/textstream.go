package router

import (
	"slices"
	"strings"

	"github.com/tilert-go/tilert/tokenizer"
)

// textStream turns token ids into the text a client sees: incremental
// detokenisation (only complete UTF-8), stop strings applied to the text
// (not to tokens), and text that might be the start of a stop string held
// back until it is known not to be one, so a stop string never leaks out
// half-sent. Special tokens are dropped when skip_special_tokens (the
// default) except those a parser reads (<think>, <tool_call>...); a stop
// id (EOS, stop_token_ids) that ends the generation adds no text, as in
// vLLM.
type textStream struct {
	tok         *tokenizer.Tokenizer
	dec         *tokenizer.Decoder
	skipSpecial bool
	keep        map[int]bool // special ids kept as text for the parsers
	stopIDs     []int
	stops       []string
	includeStop bool
	held        string // decoded, not yet emitted
	stopped     bool
	ids         int // tokens consumed
}

func newTextStream(tok *tokenizer.Tokenizer, r *genRequest) *textStream {
	return &textStream{tok: tok, dec: tok.NewDecoder(), skipSpecial: r.SkipSpecial, keep: r.keepIDs,
		stopIDs: r.stopIDs, stops: r.Stop, includeStop: r.IncludeStop}
}

// add consumes one id and returns the text now safe to emit. After a stop
// string matched, stopped is set and further ids are ignored.
func (s *textStream) add(id int) string {
	if s.stopped {
		return ""
	}
	s.ids++
	if slices.Contains(s.stopIDs, id) || (s.skipSpecial && s.tok.IsSpecial(id) && !s.keep[id]) {
		return s.push("")
	}
	return s.push(s.dec.Add(id))
}

// finish returns everything still held (the generation ended without a
// stop string, so nothing held can become one).
func (s *textStream) finish() string {
	if s.stopped {
		return ""
	}
	out := s.push(s.dec.Flush())
	if s.stopped {
		return out
	}
	out += s.held
	s.held = ""
	return out
}

// end returns everything held, as finish does, and ignores later ids: the
// generation ends here without a stop string.
func (s *textStream) end() string {
	out := s.finish()
	s.stopped = true
	return out
}

func (s *textStream) push(piece string) string {
	if piece == "" && s.held == "" {
		return ""
	}
	s.held += piece
	if len(s.stops) == 0 {
		out := s.held
		s.held = ""
		return out
	}
	// Earliest stop string wins; a stop can only start inside held, since
	// any text that could begin one was held back.
	at, which := -1, ""
	for _, st := range s.stops {
		if i := strings.Index(s.held, st); i >= 0 && (at < 0 || i < at || (i == at && len(st) > len(which))) {
			at, which = i, st
		}
	}
	if at >= 0 {
		end := at
		if s.includeStop {
			end += len(which)
		}
		out := s.held[:end]
		s.held, s.stopped = "", true
		return out
	}
	keep := 0
	for _, st := range s.stops {
		for k := min(len(st)-1, len(s.held)); k > keep; k-- {
			if strings.HasSuffix(s.held, st[:k]) {
				keep = k
				break
			}
		}
	}
	out := s.held[:len(s.held)-keep]
	s.held = s.held[len(s.held)-keep:]
	return out
}
