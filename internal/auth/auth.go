// Package auth holds the shared-secret and bearer-token primitives every
// port uses: loading a secret file that only its owner can read, HMAC-SHA256
// challenge-responses, constant-time token sets, and unguessable ids.
// docs/SECURITY.md says which port checks what.
package auth

import (
	"bufio"
	"bytes"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"os"
	"strings"

	"github.com/cockroachdb/errors"
)

// MinSecretBytes is the shortest secret accepted: 128 bits of a random
// hex or base64 string leave no room for guessing.
const MinSecretBytes = 16

// NonceBytes is the size of every challenge nonce.
const NonceBytes = 32

// CheckPrivateFile refuses a file that a group or other users may read or
// write: a secret readable by others is no secret.
func CheckPrivateFile(path string) error {
	fi, err := os.Stat(path)
	if err != nil {
		return errors.WithHint(errors.Wrapf(err, "auth: %s", path), "point it at an existing file")
	}
	if !fi.Mode().IsRegular() {
		return errors.WithHint(errors.Newf("auth: %s is not a regular file", path), "point it at a file holding the secret")
	}
	if perm := fi.Mode().Perm(); perm&0o077 != 0 {
		return errors.WithHintf(errors.Newf("auth: %s has mode %#o: group or others may read it", path, perm),
			"run chmod 600 %s", path)
	}
	return nil
}

// LoadSecret reads a secret file: the whole file, surrounding whitespace
// trimmed, at least MinSecretBytes, mode 0600 or tighter.
func LoadSecret(path string) ([]byte, error) {
	if err := CheckPrivateFile(path); err != nil {
		return nil, err
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, errors.Wrapf(err, "auth: reading %s", path)
	}
	b = bytes.TrimSpace(b)
	if len(b) < MinSecretBytes {
		return nil, errors.WithHintf(errors.Newf("auth: the secret in %s has %d bytes, at least %d are needed", path, len(b), MinSecretBytes),
			"write a random secret: head -c 32 /dev/urandom | base64 > %s; chmod 600 %s", path, path)
	}
	return b, nil
}

// LoadTokens reads a token file: one token a line, blank lines and lines
// starting with # skipped; each at least MinSecretBytes.
func LoadTokens(path string) ([]string, error) {
	if err := CheckPrivateFile(path); err != nil {
		return nil, err
	}
	f, err := os.Open(path)
	if err != nil {
		return nil, errors.Wrapf(err, "auth: reading %s", path)
	}
	defer f.Close()
	var out []string
	sc := bufio.NewScanner(f)
	for line := 1; sc.Scan(); line++ {
		t := strings.TrimSpace(sc.Text())
		if t == "" || strings.HasPrefix(t, "#") {
			continue
		}
		if len(t) < MinSecretBytes {
			return nil, errors.WithHintf(errors.Newf("auth: %s:%d: token of %d bytes, at least %d are needed", path, line, len(t), MinSecretBytes),
				"use random tokens, e.g. head -c 24 /dev/urandom | base64")
		}
		out = append(out, t)
	}
	if err := sc.Err(); err != nil {
		return nil, errors.Wrapf(err, "auth: reading %s", path)
	}
	if len(out) == 0 {
		return nil, errors.WithHintf(errors.Newf("auth: %s holds no token", path), "write one token a line")
	}
	return out, nil
}

// MAC is HMAC-SHA256(key, label || parts...), each part length-prefixed so
// no two different inputs give the same message.
func MAC(key []byte, label string, parts ...[]byte) []byte {
	m := hmac.New(sha256.New, key)
	m.Write([]byte(label))
	for _, p := range parts {
		var n [4]byte
		n[0], n[1], n[2], n[3] = byte(len(p)>>24), byte(len(p)>>16), byte(len(p)>>8), byte(len(p))
		m.Write(n[:])
		m.Write(p)
	}
	return m.Sum(nil)
}

// Equal compares two MACs or tokens in constant time.
func Equal(a, b []byte) bool { return hmac.Equal(a, b) }

// Nonce returns NonceBytes fresh random bytes.
func Nonce() []byte {
	b := make([]byte, NonceBytes)
	_, _ = rand.Read(b) // crypto/rand.Read never fails on supported platforms
	return b
}

// RandomID is a fresh unguessable id: 128 random bits in hex, with prefix.
func RandomID(prefix string) string {
	b := make([]byte, 16)
	_, _ = rand.Read(b)
	return prefix + hex.EncodeToString(b)
}

// DerivedToken is the decode node's /pd/* token when only the shared
// secret is configured: both the router and the node compute it.
func DerivedToken(secret []byte) string {
	return hex.EncodeToString(MAC(secret, "tilert pd http token v1"))
}

// Tokens is a set of bearer tokens checked in constant time.
type Tokens struct{ list [][]byte }

// NewTokens builds a set; an empty set accepts nothing (see Enabled).
func NewTokens(tokens ...string) *Tokens {
	t := &Tokens{}
	for _, s := range tokens {
		if s != "" {
			t.list = append(t.list, []byte(s))
		}
	}
	return t
}

// Enabled says whether any token is configured.
func (t *Tokens) Enabled() bool { return t != nil && len(t.list) > 0 }

// Check returns the index of the token that got (the token itself, not the
// header) matches, or -1. Every token is compared, so the time taken does
// not tell which one or how much matched.
func (t *Tokens) Check(got []byte) int {
	if t == nil {
		return -1
	}
	idx := -1
	for i, want := range t.list {
		if subtle.ConstantTimeCompare(got, want) == 1 {
			idx = i
		}
	}
	return idx
}

// Bearer extracts the token of an "Authorization: Bearer <token>" header
// value; nil when the header is not a bearer credential.
func Bearer(header []byte) []byte {
	const p = "bearer "
	if len(header) <= len(p) || !strings.EqualFold(string(header[:len(p)]), p) {
		return nil
	}
	return bytes.TrimSpace(header[len(p):])
}
