package router

import (
	"bufio"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/tilert-go/tilert/internal/netguard/floodtest"
	"github.com/valyala/fasthttp"

	"github.com/tilert-go/tilert/config"
)

// guarded serves a stub API behind the guard on the router's listener:
// /v1/slow streams one line every 50 ms until the client leaves or 2 s
// pass; /v1/echo answers the body's length; /health is open.
func guarded(t *testing.T, cfg *config.Config) (*Guard, string) {
	t.Helper()
	g, err := NewGuard(cfg)
	if err != nil {
		t.Fatal(err)
	}
	h := func(ctx *fasthttp.RequestCtx) {
		switch string(ctx.Path()) {
		case "/v1/slow":
			ctx.SetBodyStreamWriter(func(w *bufio.Writer) {
				for i := 0; i < 40; i++ {
					fmt.Fprintf(w, "data: %d\n\n", i)
					if w.Flush() != nil {
						return
					}
					time.Sleep(50 * time.Millisecond)
				}
			})
		case "/v1/echo":
			fmt.Fprintf(ctx, `{"n":%d}`, len(ctx.PostBody()))
		default:
			ctx.SetBodyString(`{"status":"ok"}`)
		}
	}
	s := &fasthttp.Server{Handler: g.Wrap(h)}
	g.Limit(s)
	ln, err := Listen(cfg)
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = s.Serve(ln) }()
	t.Cleanup(func() { _ = s.Shutdown() })
	return g, ln.Addr().String()
}

func guardConfig(t *testing.T, keys ...string) *config.Config {
	t.Helper()
	cfg := config.Default()
	cfg.Router.Port = 0
	if len(keys) > 0 {
		f := filepath.Join(t.TempDir(), "keys")
		if err := os.WriteFile(f, []byte(strings.Join(keys, "\n")+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		cfg.Router.APIKeysFile = f
		cfg.Router.Host = "127.0.0.1"
	}
	return cfg
}

func call(t *testing.T, c *http.Client, method, url, key, body string) (*http.Response, []byte) {
	t.Helper()
	req, _ := http.NewRequest(method, url, strings.NewReader(body))
	if key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp, b
}

// Finding: no API key option anywhere. With keys, /v1/* without a key or
// with a wrong one is 401 in OpenAI's error shape; a key in the file, or
// the single api_key, is let in; /health stays open for probes.
func TestAPIKeys(t *testing.T) {
	cfg := guardConfig(t, "sk-first-key-0123456789", "sk-second-key-0123456789")
	cfg.Router.APIKey = "sk-single-key-0123456789"
	_, addr := guarded(t, cfg)
	base := "http://" + addr
	for _, key := range []string{"", "sk-first-key-012345678", "Basic x"} {
		resp, body := call(t, http.DefaultClient, "POST", base+"/v1/echo", key, "{}")
		var e struct {
			Error struct{ Message, Type, Code string } `json:"error"`
		}
		if resp.StatusCode != 401 || json.Unmarshal(body, &e) != nil || e.Error.Type != "invalid_request_error" || e.Error.Code != "invalid_api_key" {
			t.Fatalf("key %q: %d %s, want 401 in OpenAI's shape", key, resp.StatusCode, body)
		}
	}
	for _, key := range []string{"sk-first-key-0123456789", "sk-second-key-0123456789", "sk-single-key-0123456789"} {
		if resp, body := call(t, http.DefaultClient, "POST", base+"/v1/echo", key, "{}"); resp.StatusCode != 200 {
			t.Fatalf("key %q: %d %s", key, resp.StatusCode, body)
		}
	}
	if resp, _ := call(t, http.DefaultClient, "GET", base+"/health", "", ""); resp.StatusCode != 200 {
		t.Fatalf("/health without a key: %d", resp.StatusCode)
	}
}

// Per-key quota: past router.max_concurrent_per_key a key gets 429 naming
// the limit, other keys are not affected, and the slot comes back when a
// stream ends or its client leaves.
func TestKeyConcurrency(t *testing.T) {
	cfg := guardConfig(t, "sk-a-0123456789abcdef", "sk-b-0123456789abcdef")
	cfg.Router.KeyConcurrency = 2
	g, addr := guarded(t, cfg)
	base := "http://" + addr
	open := func(key string) *http.Response {
		req, _ := http.NewRequest("GET", base+"/v1/slow", nil)
		req.Header.Set("Authorization", "Bearer "+key)
		tr := &http.Transport{}
		resp, err := (&http.Client{Transport: tr}).Do(req)
		if err != nil {
			t.Fatal(err)
		}
		return resp
	}
	r1, r2 := open("sk-a-0123456789abcdef"), open("sk-a-0123456789abcdef")
	resp, body := call(t, http.DefaultClient, "GET", base+"/v1/slow", "sk-a-0123456789abcdef", "")
	if resp.StatusCode != 429 || !strings.Contains(string(body), "router.max_concurrent_per_key") || resp.Header.Get("Retry-After") == "" {
		t.Fatalf("third stream of one key: %d %s", resp.StatusCode, body)
	}
	rb := open("sk-b-0123456789abcdef")
	if rb.StatusCode != 200 {
		t.Fatalf("another key: %d", rb.StatusCode)
	}
	_ = rb.Body.Close()
	_, _ = io.Copy(io.Discard, r1.Body) // ends normally
	_ = r1.Body.Close()
	_ = r2.Body.Close() // client leaves mid-stream
	deadline := time.Now().Add(5 * time.Second)
	for g.InFlight(0) != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("%d requests of key 0 still counted after their streams ended", g.InFlight(0))
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// Finding: a 10 MB body was read and forwarded to prefill. A body past
// router.max_body_bytes is refused from its Content-Length (413, OpenAI's
// shape, naming the key) before the handler runs.
func TestBodyLimit(t *testing.T) {
	cfg := guardConfig(t)
	cfg.Router.MaxBodyBytes = 64 << 10
	_, addr := guarded(t, cfg)
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	// The declared length is refused after at most 8 KiB have been read
	// (fasthttp's pre-read), never the 10 MB.
	fmt.Fprintf(c, "POST /v1/echo HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s", 10<<20, strings.Repeat("x", 16<<10))
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 413 || !strings.Contains(string(body), "router.max_body_bytes") {
		t.Fatalf("10 MB body: %d %s", resp.StatusCode, body)
	}
	// A chunked body (no declared length) is cut at the limit as it arrives.
	pr, pw := io.Pipe()
	go func() {
		for range 20 {
			if _, err := pw.Write([]byte(strings.Repeat("y", 10<<10))); err != nil {
				return
			}
		}
		_ = pw.Close()
	}()
	creq, _ := http.NewRequest("POST", "http://"+addr+"/v1/echo", pr)
	if cresp, err := http.DefaultClient.Do(creq); err == nil {
		cb, _ := io.ReadAll(cresp.Body)
		cresp.Body.Close()
		if cresp.StatusCode != 413 || !strings.Contains(string(cb), "router.max_body_bytes") {
			t.Fatalf("200 KiB chunked body: %d %s", cresp.StatusCode, cb)
		}
	}
	_ = pr.Close()
	if resp, body := call(t, http.DefaultClient, "POST", "http://"+addr+"/v1/echo", "", strings.Repeat("x", 1000)); resp.StatusCode != 200 || string(body) != `{"n":1000}` {
		t.Fatalf("small body: %d %s", resp.StatusCode, body)
	}
}

// Findings: slow bodies were never timed out, up to 32 MB buffered per
// connection. A bounded flood from another loopback address (half-open
// connections, slowloris headers, bodies that stop half-way): other
// clients are served, memory stays small, the router cuts every flooding
// connection within security.read_timeout_s.
func TestRouterFloodsBounded(t *testing.T) {
	cfg := guardConfig(t)
	cfg.Security.ReadTimeoutS, cfg.Security.IdleTimeoutS, cfg.Security.MaxConnsPerPeer = 1, 1.5, 400
	_, addr := guarded(t, cfg)
	d := floodtest.OtherPeer(t, addr)
	before := floodtest.HeapInUse()
	var conns []net.Conn
	tr := floodtest.NewTrickler()
	for i := range 150 {
		c, err := d.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		conns = append(conns, c)
		switch i % 3 {
		case 1:
			_, _ = c.Write([]byte("POST /v1/echo HTTP/1.1\r\nHost: x\r\n"))
			tr.Start(c, []byte("X"), true)
		case 2:
			_, _ = c.Write([]byte("POST /v1/echo HTTP/1.1\r\nHost: x\r\nContent-Length: 4000000\r\n\r\n{\"prompt\":\""))
		}
	}
	held := floodtest.HeapInUse()
	if resp, body := call(t, http.DefaultClient, "POST", "http://"+addr+"/v1/echo", "", "{}"); resp.StatusCode != 200 {
		t.Fatalf("a client during the flood: %d %s", resp.StatusCode, body)
	}
	floodtest.HeapBounded(t, len(conns), before, held, 64<<20)
	floodtest.AllClosed(t, conns, 5*time.Second)
	tr.Stop()
}

// --tls-cert/--tls-key serve HTTPS; a bad pair is refused at start.
func TestRouterTLS(t *testing.T) {
	dir := t.TempDir()
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "localhost"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)}}
	der, _ := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	kb, _ := x509.MarshalECPrivateKey(key)
	certFile, keyFile := filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	_ = os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600)
	_ = os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kb}), 0o600)
	cfg := guardConfig(t, "sk-tls-0123456789abcdef")
	cfg.Router.TLSCert, cfg.Router.TLSKey = certFile, keyFile
	_, addr := guarded(t, cfg)
	pool := x509.NewCertPool()
	pool.AddCert(must(x509.ParseCertificate(der)))
	c := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}}
	if resp, body := call(t, c, "POST", "https://"+addr+"/v1/echo", "sk-tls-0123456789abcdef", "{}"); resp.StatusCode != 200 {
		t.Fatalf("https: %d %s", resp.StatusCode, body)
	}
	if _, err := http.Get("http://" + addr + "/health"); err == nil {
		// plain HTTP to a TLS port gets no HTTP answer
		t.Log("plain http got an answer (Go's TLS server answers 400 to plain HTTP)")
	}
	cfg.Router.TLSKey = certFile
	if _, err := Listen(cfg); err == nil {
		t.Fatal("a certificate without its key was accepted")
	}
}

func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}
