package tokenizer

// GPT-2 style byte-level alphabet: every byte maps to one printable rune so
// that BPE can work on text without ever seeing raw control bytes or spaces.
// Printable Latin-1 bytes map to themselves; the rest are shifted to U+0100+.
var (
	byteToRune [256]rune
	runeToByte = map[rune]byte{}
)

func init() {
	n := 0
	for b := 0; b < 256; b++ {
		if (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF) {
			byteToRune[b] = rune(b)
		} else {
			byteToRune[b] = rune(256 + n)
			n++
		}
		runeToByte[byteToRune[b]] = byte(b)
	}
}

// byteLevelString maps raw bytes to the byte-level alphabet.
func byteLevelString(b []byte) string {
	rs := make([]rune, len(b))
	for i, c := range b {
		rs[i] = byteToRune[c]
	}
	return string(rs)
}

// tokenBytes returns the bytes a token stands for, the way HF's ByteLevel
// decoder does it: if every rune of the token is in the byte-level alphabet
// the token is mapped back rune by rune, otherwise (added tokens such as
// "<｜end▁of▁sentence｜>") its own UTF-8 bytes are used unchanged.
func tokenBytes(tok string) (b []byte, byteLevel bool) {
	out := make([]byte, 0, len(tok))
	for _, r := range tok {
		c, ok := runeToByte[r]
		if !ok {
			return []byte(tok), false
		}
		out = append(out, c)
	}
	return out, true
}
