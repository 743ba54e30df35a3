package tokenizer

import "unicode/utf8"

func utf8ValidString(s string) bool { return utf8.ValidString(s) }

// Decode turns ids into text like HF's ByteLevel decoder: the bytes of all
// tokens are joined and invalid UTF-8 becomes U+FFFD per maximal invalid
// subsequence (Rust's from_utf8_lossy). Unknown ids are skipped, as HF does.
func (t *Tokenizer) Decode(ids []int, skipSpecial bool) string {
	var buf []byte
	for _, id := range ids {
		if id < 0 || id >= len(t.idBytes) || t.idBytes[id] == nil || (skipSpecial && t.special[id]) {
			continue
		}
		buf = append(buf, t.idBytes[id]...)
	}
	out, _ := appendLossy(make([]byte, 0, len(buf)), buf, true)
	return string(out)
}

// TokenBytes returns the raw bytes id decodes to (nil if unknown); they may
// be part of a multi-byte character.
func (t *Tokenizer) TokenBytes(id int) []byte {
	if id < 0 || id >= len(t.idBytes) {
		return nil
	}
	return t.idBytes[id]
}

// appendLossy appends the text of b to dst. With final false it stops before
// a trailing sequence that could still become a valid character and returns
// how many bytes it consumed; with final true it consumes everything.
func appendLossy(dst, b []byte, final bool) ([]byte, int) {
	i := 0
	for i < len(b) {
		c := b[i]
		if c < utf8.RuneSelf {
			dst = append(dst, c)
			i++
			continue
		}
		n, lo, hi := seqInfo(c)
		if n == 0 {
			dst = append(dst, "\uFFFD"...)
			i++
			continue
		}
		// count how many bytes of this sequence are well formed
		k := 1
		for k < n && i+k < len(b) {
			x := b[i+k]
			if k == 1 {
				if x < lo || x > hi {
					break
				}
			} else if x < 0x80 || x > 0xBF {
				break
			}
			k++
		}
		switch {
		case k == n:
			dst = append(dst, b[i:i+n]...)
			i += n
		case i+k == len(b) && !final:
			return dst, i // may still complete
		default:
			dst = append(dst, "\uFFFD"...)
			i += k
		}
	}
	return dst, i
}

// seqInfo gives the length of the UTF-8 sequence led by c and the allowed
// range of its second byte (Unicode Table 3-7); n == 0 for bytes that never
// lead a sequence.
func seqInfo(c byte) (n int, lo, hi byte) {
	switch {
	case c >= 0xC2 && c <= 0xDF:
		return 2, 0x80, 0xBF
	case c == 0xE0:
		return 3, 0xA0, 0xBF
	case c >= 0xE1 && c <= 0xEC, c == 0xEE, c == 0xEF:
		return 3, 0x80, 0xBF
	case c == 0xED:
		return 3, 0x80, 0x9F
	case c == 0xF0:
		return 4, 0x90, 0xBF
	case c >= 0xF1 && c <= 0xF3:
		return 4, 0x80, 0xBF
	case c == 0xF4:
		return 4, 0x80, 0x8F
	}
	return 0, 0, 0
}

// Decoder detokenises a stream of ids, returning only complete UTF-8 text:
// bytes of a character split across tokens are held until it is whole. The
// concatenation of every Add result and Flush equals Decode of all ids.
// A Decoder is not safe for concurrent use.
type Decoder struct {
	t           *Tokenizer
	skipSpecial bool
	pending     []byte
	out         []byte
}

// DecoderOption configures NewDecoder.
type DecoderOption func(*Decoder)

// SkipSpecial makes the Decoder drop special added tokens, like
// Decode(ids, true).
func SkipSpecial() DecoderOption { return func(d *Decoder) { d.skipSpecial = true } }

// NewDecoder starts an incremental detokeniser.
func (t *Tokenizer) NewDecoder(opts ...DecoderOption) *Decoder {
	d := &Decoder{t: t}
	for _, o := range opts {
		o(d)
	}
	return d
}

// Add feeds one id and returns the text that became complete ("" if none).
func (d *Decoder) Add(id int) string {
	t := d.t
	if id < 0 || id >= len(t.idBytes) || t.idBytes[id] == nil || (d.skipSpecial && t.special[id]) {
		return ""
	}
	b := t.idBytes[id]
	if len(d.pending) == 0 {
		// common case: a token of whole characters needs no buffering
		if s, ok := t.idText(id); ok {
			return s
		}
	}
	d.pending = append(d.pending, b...)
	var n int
	d.out, n = appendLossy(d.out[:0], d.pending, false)
	d.pending = d.pending[:copy(d.pending, d.pending[n:])]
	return string(d.out)
}

// Flush returns what is still held (as U+FFFD, since it never completed)
// and resets the Decoder.
func (d *Decoder) Flush() string {
	out, _ := appendLossy(d.out[:0], d.pending, true)
	d.pending = d.pending[:0]
	return string(out)
}

// Pending reports how many bytes are held waiting for the rest of a character.
func (d *Decoder) Pending() int { return len(d.pending) }

// Reset drops held bytes.
func (d *Decoder) Reset() { d.pending = d.pending[:0] }
