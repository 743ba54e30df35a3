package auth

import (
	"bytes"
	"testing"
)

func TestTokens(t *testing.T) {
	toks := NewTokens("first-token-0123456789", "", "second-token-0123456789")
	cases := []struct {
		header string
		want   int
	}{
		{"Bearer first-token-0123456789", 0},
		{"bearer second-token-0123456789", 1},
		{"Bearer  second-token-0123456789 ", 1},
		{"Bearer first-token-012345678", -1},
		{"Basic first-token-0123456789", -1},
		{"first-token-0123456789", -1},
		{"", -1},
		{"Bearer ", -1},
	}
	for _, c := range cases {
		if got := toks.Check(Bearer([]byte(c.header))); got != c.want {
			t.Errorf("%q: %d, want %d", c.header, got, c.want)
		}
	}
	if NewTokens().Enabled() || !toks.Enabled() {
		t.Error("Enabled")
	}
}

// MAC's parts are length-prefixed: moving bytes between parts changes it.
func TestMACFraming(t *testing.T) {
	k := []byte("k")
	if bytes.Equal(MAC(k, "l", []byte("ab"), []byte("c")), MAC(k, "l", []byte("a"), []byte("bc"))) {
		t.Fatal("parts are not framed")
	}
	if !bytes.Equal(MAC(k, "l", []byte("a")), MAC(k, "l", []byte("a"))) || bytes.Equal(MAC(k, "l"), MAC([]byte("j"), "l")) {
		t.Fatal("MAC is not a keyed function")
	}
	if a, b := RandomID("r-"), RandomID("r-"); a == b || len(a) != 34 {
		t.Fatalf("RandomID %q %q", a, b)
	}
}
