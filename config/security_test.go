package config

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func writeMode(t *testing.T, name, body string, mode os.FileMode) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(p, []byte(body), mode); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(p, mode); err != nil {
		t.Fatal(err)
	}
	return p
}

// Listeners default to loopback without a secret, to every interface with
// one; an explicit address always wins.
func TestBindDefaults(t *testing.T) {
	secret := writeMode(t, "secret", "0123456789abcdef0123456789abcdef\n", 0o600)
	cases := []struct {
		name                      string
		flags                     map[string]any
		decode, transfer, sidecar string
		router                    string
	}{
		{"no secret", nil, "127.0.0.1", "127.0.0.1:0", "127.0.0.1:5558", "127.0.0.1"},
		{"secret", map[string]any{"security.secret_file": secret}, "0.0.0.0", "0.0.0.0:0", "0.0.0.0:5558", "127.0.0.1"},
		{"explicit", map[string]any{"decode.host": "10.1.2.3", "router.host": "10.1.2.4"}, "10.1.2.3", "10.1.2.3:0", "127.0.0.1:5558", "10.1.2.4"},
		{"api key", map[string]any{"router.api_key": "k-0123456789abcdef"}, "127.0.0.1", "127.0.0.1:0", "127.0.0.1:5558", "0.0.0.0"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			cfg, _, err := Load(Options{Env: noEnv, Flags: c.flags})
			if err != nil {
				t.Fatal(err)
			}
			if got := cfg.DecodeHost(); got != c.decode {
				t.Errorf("decode host %q, want %q", got, c.decode)
			}
			if got := cfg.TransferListen(); got != c.transfer {
				t.Errorf("transfer listen %q, want %q", got, c.transfer)
			}
			if got := cfg.SidecarMetricsAddr(); got != c.sidecar {
				t.Errorf("sidecar metrics %q, want %q", got, c.sidecar)
			}
			if got := cfg.RouterHost(); got != c.router {
				t.Errorf("router host %q, want %q", got, c.router)
			}
		})
	}
}

// A secret or token file others may read, or a too-short secret, is
// refused and named.
func TestSecretFiles(t *testing.T) {
	good := writeMode(t, "good", "0123456789abcdef0123456789abcdef", 0o600)
	cases := []struct {
		name, key, file, want string
	}{
		{"world readable", "security.secret_file", writeMode(t, "wr", "0123456789abcdef0123456789abcdef", 0o644), "mode"},
		{"short", "security.secret_file", writeMode(t, "short", "abc", 0o600), "at least 16"},
		{"missing", "security.secret_file", filepath.Join(t.TempDir(), "nope"), "no such file"},
		{"token group", "security.pd_token_file", writeMode(t, "tg", "0123456789abcdef0123", 0o640), "mode"},
		{"keys empty", "router.api_keys_file", writeMode(t, "ke", "# none\n\n", 0o600), "no token"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, _, err := Load(Options{Env: noEnv, Flags: map[string]any{c.key: c.file}})
			if err == nil || !strings.Contains(err.Error(), c.key) || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("err = %v, want %s named with %q", err, c.key, c.want)
			}
		})
	}
	cfg, _, err := Load(Options{Env: noEnv, Flags: map[string]any{"security.secret_file": good}})
	if err != nil {
		t.Fatal(err)
	}
	toks, err := cfg.PDTokens()
	if err != nil || len(toks) != 1 || len(toks[0]) != 64 {
		t.Fatalf("derived pd token %v %v", toks, err)
	}
}

// config check warns about every all-interfaces listener without a secret.
func TestWarnings(t *testing.T) {
	cfg, _, err := Load(Options{Env: noEnv, Flags: map[string]any{
		"decode.host": "0.0.0.0", "transfer.listen": "0.0.0.0:7000", "sidecar.metrics_host": "::", "router.host": "0.0.0.0"}})
	if err != nil {
		t.Fatal(err)
	}
	w := strings.Join(cfg.Warnings(), "\n")
	for _, want := range []string{"decode.host", "transfer.listen", "sidecar.metrics_host", "router.host"} {
		if !strings.Contains(w, want) {
			t.Errorf("no warning for %s in:\n%s", want, w)
		}
	}
	def, _, _ := Load(Options{Env: noEnv})
	if w := def.Warnings(); len(w) != 0 {
		t.Errorf("defaults warn: %v", w)
	}
	secret := writeMode(t, "secret", "0123456789abcdef0123456789abcdef", 0o600)
	sec, _, err := Load(Options{Env: noEnv, Flags: map[string]any{"decode.host": "0.0.0.0", "security.secret_file": secret}})
	if err != nil {
		t.Fatal(err)
	}
	if w := sec.Warnings(); len(w) != 0 {
		t.Errorf("secured node warns: %v", w)
	}
}

// Print never shows an API key.
func TestPrintRedactsKey(t *testing.T) {
	cfg, src, err := Load(Options{Env: noEnv, Flags: map[string]any{"router.api_key": "sk-very-secret-value"}})
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	if err := Print(&b, cfg, src); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(b.String(), "sk-very-secret-value") || !strings.Contains(b.String(), "(redacted)") {
		t.Fatalf("key not redacted:\n%s", b.String())
	}
}
