package config

import (
	"fmt"
	"net"
	"strconv"
	"time"

	"github.com/tilert-go/tilert/internal/auth"
)

// Loopback and AllInterfaces are the two default bind addresses.
const (
	Loopback      = "127.0.0.1"
	AllInterfaces = "0.0.0.0"
)

// Secured says whether a shared secret is configured: then the ctrl and
// transfer data ports authenticate peers, /pd/* wants a token, and
// listeners may default to every interface.
func (c *Config) Secured() bool { return c.Security.SecretFile != "" }

// RouterSecured says whether the router wants API keys.
func (c *Config) RouterSecured() bool { return c.Router.APIKeysFile != "" || c.Router.APIKey != "" }

// bindHost is host, or the default for its listener when empty.
func bindHost(host string, secured bool) string {
	if host != "" {
		return host
	}
	if secured {
		return AllInterfaces
	}
	return Loopback
}

// DecodeHost is the address the decode node's ctrl and http ports bind to.
func (c *Config) DecodeHost() string { return bindHost(c.Decode.Host, c.Secured()) }

// TransferListen is the decode node's transfer data address.
func (c *Config) TransferListen() string {
	if c.Transfer.Listen != "" {
		return c.Transfer.Listen
	}
	return net.JoinHostPort(c.DecodeHost(), "0")
}

// SidecarMetricsAddr is the sidecar's metrics listen address.
func (c *Config) SidecarMetricsAddr() string {
	return net.JoinHostPort(bindHost(c.Sidecar.MetricsHost, c.Secured()), strconv.Itoa(c.Sidecar.MetricsPort))
}

// RouterHost is the address the router binds to.
func (c *Config) RouterHost() string { return bindHost(c.Router.Host, c.RouterSecured()) }

// Secret loads the shared secret; nil when none is configured.
func (c *Config) Secret() ([]byte, error) {
	if c.Security.SecretFile == "" {
		return nil, nil
	}
	return auth.LoadSecret(c.Security.SecretFile)
}

// PDTokens are the bearer tokens the decode node's /pd/* accepts (the
// router presents the first): the token file's, else one derived from the
// shared secret, else none (no check; the node then binds to loopback by
// default).
func (c *Config) PDTokens() ([]string, error) {
	if c.Security.PDTokenFile != "" {
		return auth.LoadTokens(c.Security.PDTokenFile)
	}
	secret, err := c.Secret()
	if err != nil || secret == nil {
		return nil, err
	}
	return []string{auth.DerivedToken(secret)}, nil
}

// APIKeys are the keys the router accepts; empty: none needed.
func (c *Config) APIKeys() ([]string, error) {
	var keys []string
	if c.Router.APIKeysFile != "" {
		k, err := auth.LoadTokens(c.Router.APIKeysFile)
		if err != nil {
			return nil, err
		}
		keys = append(keys, k...)
	}
	if c.Router.APIKey != "" {
		keys = append(keys, c.Router.APIKey)
	}
	return keys, nil
}

func seconds(s float64) time.Duration { return time.Duration(s * float64(time.Second)) }

// ReadTimeout is security.read_timeout_s.
func (s Security) ReadTimeout() time.Duration { return seconds(s.ReadTimeoutS) }

// IdleTimeout is security.idle_timeout_s.
func (s Security) IdleTimeout() time.Duration { return seconds(s.IdleTimeoutS) }

// WriteTimeout is security.write_timeout_s.
func (s Security) WriteTimeout() time.Duration { return seconds(s.WriteTimeoutS) }

func (k *checker) security(c *Config) {
	s := c.Security
	if s.SecretFile != "" {
		if _, err := auth.LoadSecret(s.SecretFile); err != nil {
			k.bad("security.secret_file", "write at least 16 random bytes to it and chmod 600, or leave it empty", "%v", err)
		}
	}
	if s.PDTokenFile != "" {
		if _, err := auth.LoadTokens(s.PDTokenFile); err != nil {
			k.bad("security.pd_token_file", "one random token a line, mode 0600, or leave it empty", "%v", err)
		}
	}
	k.between("security.max_conns", s.MaxConns, 1, 1<<20)
	k.between("security.max_conns_per_peer", s.MaxConnsPerPeer, 1, 1<<20)
	k.positive("security.read_timeout_s", s.ReadTimeoutS)
	k.positive("security.idle_timeout_s", s.IdleTimeoutS)
	k.positive("security.write_timeout_s", s.WriteTimeoutS)
	k.between("security.max_frame_bytes", s.MaxFrameBytes, 4096, 16<<20)
	if !(s.AdmitsPerS >= 0) {
		k.bad("security.admits_per_s", "use 0 (no limit) or a positive rate", "%v is negative", s.AdmitsPerS)
	}
	k.between("security.cancelled_rids", s.CancelledRIDs, 16, 1<<24)
	k.between("security.max_rid_bytes", s.MaxRIDBytes, 16, 4096)
	k.between("security.max_body_bytes", s.MaxBodyBytes, 4096, 1<<30)
	k.between("security.max_header_bytes", s.MaxHeaderBytes, 4096, 1<<20)

	if c.Router.APIKeysFile != "" {
		if _, err := auth.LoadTokens(c.Router.APIKeysFile); err != nil {
			k.bad("router.api_keys_file", "one key a line, mode 0600, or leave it empty", "%v", err)
		}
	}
	if (c.Router.TLSCert == "") != (c.Router.TLSKey == "") {
		k.bad("router.tls_cert", "set both router.tls_cert and router.tls_key, or neither", "only one of tls_cert and tls_key is set")
	}
	k.between("router.max_concurrent_per_key", c.Router.KeyConcurrency, 0, 1<<20)
	k.between("router.max_body_bytes", c.Router.MaxBodyBytes, 4096, 1<<30)
}

// Warnings lists configurations that are valid but unsafe: a listener on
// every interface that nothing authenticates. `tilert config check` prints
// them.
func (c *Config) Warnings() []string {
	var out []string
	open := func(path, host string) {
		ip := net.ParseIP(host)
		if host == "" || host == "::" || (ip != nil && ip.IsUnspecified()) {
			out = append(out, fmt.Sprintf("%s listens on all interfaces (%q) without authentication: anyone who can reach it can use it", path, host))
		}
	}
	if !c.Secured() {
		if c.Decode.Host != "" {
			open("decode.host (ctrl and http ports)", c.Decode.Host)
		}
		if h, _, err := net.SplitHostPort(c.Transfer.Listen); err == nil && c.Transfer.Listen != "" {
			open("transfer.listen", h)
		}
		if c.Sidecar.MetricsHost != "" && c.Sidecar.MetricsPort != 0 {
			open("sidecar.metrics_host", c.Sidecar.MetricsHost)
		}
	}
	if !c.RouterSecured() && c.Router.Host != "" {
		open("router.host", c.Router.Host)
	}
	for i := range out {
		out[i] += "; set security.secret_file (router: router.api_keys_file) or bind to 127.0.0.1"
	}
	return out
}
