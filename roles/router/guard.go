package router

// The router's front door (docs/SECURITY.md): API keys like vLLM's
// --api-key, per-key concurrency quotas, request size and slowloris limits,
// connection caps and optional TLS. It wraps the router's handler and
// listener; the OpenAI handlers know nothing of it.

import (
	"bytes"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"

	cerrors "github.com/cockroachdb/errors"
	"github.com/valyala/fasthttp"

	"github.com/tilert-go/tilert/config"
	"github.com/tilert-go/tilert/internal/auth"
	"github.com/tilert-go/tilert/internal/netguard"
)

// Guard authenticates API requests and bounds what one key may hold.
type Guard struct {
	keys   *auth.Tokens
	perKey int
	// sec and maxBody are named in refusals.
	sec     config.Security
	maxBody int

	mu       sync.Mutex
	inflight map[int]int // key index -> requests in flight
}

// NewGuard builds the guard for cfg: its API keys (none: every request is
// let in, as vLLM without --api-key), per-key quota and limits.
func NewGuard(cfg *config.Config) (*Guard, error) {
	keys, err := cfg.APIKeys()
	if err != nil {
		return nil, err
	}
	return &Guard{keys: auth.NewTokens(keys...), perKey: cfg.Router.KeyConcurrency, sec: cfg.Security,
		maxBody: cfg.Router.MaxBodyBytes, inflight: map[int]int{}}, nil
}

// protected says whether path needs a key: the OpenAI API under /v1, as
// vLLM's --api-key; /health and /metrics stay open for probes.
func protected(path []byte) bool { return strings.HasPrefix(string(path), "/v1") }

// openAIError writes OpenAI's error shape:
// {"error":{"message","type","param","code"}}.
func openAIError(ctx *fasthttp.RequestCtx, status int, typ, code, msg string) {
	b, _ := json.Marshal(map[string]any{"error": map[string]any{"message": msg, "type": typ, "param": nil, "code": code}})
	ctx.Response.Reset()
	ctx.SetStatusCode(status)
	ctx.SetContentType("application/json")
	ctx.SetBody(b)
}

// release gives a key's quota slot back when fasthttp resets the request,
// after the whole response, a stream included, has been written (or the
// connection died): fasthttp closes user values that are io.Closers then.
type release struct {
	g    *Guard
	key  int
	once sync.Once
}

func (r *release) Close() error {
	r.once.Do(func() {
		r.g.mu.Lock()
		if r.g.inflight[r.key]--; r.g.inflight[r.key] <= 0 {
			delete(r.g.inflight, r.key)
		}
		r.g.mu.Unlock()
	})
	return nil
}

// Wrap returns next behind the guard: API requests without a valid key get
// 401 (constant-time compare), and past the key's quota 429 naming
// router.max_concurrent_per_key.
func (g *Guard) Wrap(next fasthttp.RequestHandler) fasthttp.RequestHandler {
	return func(ctx *fasthttp.RequestCtx) {
		if !g.readBody(ctx) {
			return
		}
		if !g.keys.Enabled() || !protected(ctx.Path()) {
			next(ctx)
			return
		}
		key := g.keys.Check(auth.Bearer(ctx.Request.Header.Peek("Authorization")))
		if key < 0 {
			openAIError(ctx, fasthttp.StatusUnauthorized, "invalid_request_error", "invalid_api_key",
				"Incorrect or missing API key: send Authorization: Bearer <key> (router.api_keys_file).")
			ctx.Response.Header.Set("WWW-Authenticate", `Bearer realm="tilert"`)
			return
		}
		if g.perKey > 0 {
			g.mu.Lock()
			over := g.inflight[key] >= g.perKey
			if !over {
				g.inflight[key]++
			}
			g.mu.Unlock()
			if over {
				openAIError(ctx, fasthttp.StatusTooManyRequests, "rate_limit_error", "rate_limit_exceeded",
					fmt.Sprintf("this API key already has %d requests in flight (router.max_concurrent_per_key)", g.perKey))
				ctx.Response.Header.Set("Retry-After", "1")
				return
			}
			ctx.SetUserValue(releaseKey{}, &release{g: g, key: key})
		}
		next(ctx)
	}
}

type releaseKey struct{}

// readBody reads a streamed request body (Limit sets StreamRequestBody)
// within router.max_body_bytes, growing its buffer only as bytes arrive,
// and hands it to the handler as an ordinary body. A declared length past
// the limit is refused before a byte of it is read; a body that does not
// arrive within the read timeout is refused (408). It reports whether the
// handler may run.
func (g *Guard) readBody(ctx *fasthttp.RequestCtx) bool {
	if !ctx.Request.IsBodyStream() {
		return true
	}
	tooLarge := func() bool {
		openAIError(ctx, fasthttp.StatusRequestEntityTooLarge, "invalid_request_error", "body_too_large",
			fmt.Sprintf("request body exceeds router.max_body_bytes (%d)", g.maxBody))
		ctx.SetConnectionClose()
		return false
	}
	if cl := ctx.Request.Header.ContentLength(); cl > g.maxBody {
		return tooLarge()
	}
	var buf bytes.Buffer
	n, err := io.Copy(&buf, io.LimitReader(ctx.RequestBodyStream(), int64(g.maxBody)+1))
	if err != nil {
		g.ErrorHandler(ctx, err)
		ctx.SetConnectionClose()
		return false
	}
	if n > int64(g.maxBody) {
		return tooLarge()
	}
	ctx.Request.SetBody(buf.Bytes())
	return true
}

// InFlight counts key index k's requests in flight (tests).
func (g *Guard) InFlight(k int) int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.inflight[k]
}

// ErrorHandler answers requests fasthttp could not read (too large, too
// slow, malformed) in OpenAI's error shape, naming the limit.
func (g *Guard) ErrorHandler(ctx *fasthttp.RequestCtx, err error) {
	var small *fasthttp.ErrSmallBuffer
	var ne net.Error
	switch {
	case errors.As(err, &small):
		openAIError(ctx, fasthttp.StatusRequestHeaderFieldsTooLarge, "invalid_request_error", "header_too_large",
			fmt.Sprintf("request headers exceed security.max_header_bytes (%d)", g.sec.MaxHeaderBytes))
	case errors.Is(err, fasthttp.ErrBodyTooLarge):
		openAIError(ctx, fasthttp.StatusRequestEntityTooLarge, "invalid_request_error", "body_too_large",
			fmt.Sprintf("request body exceeds router.max_body_bytes (%d)", g.maxBody))
	case errors.As(err, &ne) && ne.Timeout():
		openAIError(ctx, fasthttp.StatusRequestTimeout, "invalid_request_error", "request_timeout",
			fmt.Sprintf("the request did not arrive within security.read_timeout_s (%gs)", g.sec.ReadTimeoutS))
	default:
		openAIError(ctx, fasthttp.StatusBadRequest, "invalid_request_error", "bad_request", "unreadable HTTP request: "+err.Error())
	}
}

// Limit sets s's size and slowloris limits from the configuration: the
// body (router.max_body_bytes, checked on Content-Length before reading),
// the header block (fasthttp's read buffer), the time to read a request and
// the idle keep-alive time. Streamed answers have no write deadline.
func (g *Guard) Limit(s *fasthttp.Server) {
	s.MaxRequestBodySize = g.maxBody
	s.ReadBufferSize = g.sec.MaxHeaderBytes
	s.ReadTimeout = g.sec.ReadTimeout()
	s.IdleTimeout = g.sec.IdleTimeout()
	s.ErrorHandler = g.ErrorHandler
	// Read the body as it arrives instead of allocating its declared
	// length up front: a connection that announces 4 MB and sends 10 bytes
	// holds 10 bytes (PostBody still returns the whole body).
	s.StreamRequestBody = true
}

// Listen opens the router's listener: the bind address (router.host, else
// loopback without API keys), connection caps, and TLS when
// router.tls_cert/tls_key are set.
func Listen(cfg *config.Config) (net.Listener, error) {
	rc := cfg.Router
	var tlsCfg *tls.Config
	if rc.TLSCert != "" {
		cert, err := tls.LoadX509KeyPair(rc.TLSCert, rc.TLSKey)
		if err != nil {
			return nil, cerrors.WithHint(cerrors.Wrap(err, "router: TLS certificate"),
				"point router.tls_cert (--tls-cert) and router.tls_key (--tls-key) at a PEM certificate chain and its key")
		}
		tlsCfg = &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
	}
	ln, err := net.Listen("tcp", net.JoinHostPort(cfg.RouterHost(), strconv.Itoa(rc.Port)))
	if err != nil {
		return nil, cerrors.WithHint(cerrors.Wrap(err, "router: listen"), "pick a free --port (0 lets the kernel choose)")
	}
	sec := cfg.Security
	var out net.Listener = netguard.Wrap(ln, netguard.Limits{MaxConns: sec.MaxConns, MaxPerPeer: sec.MaxConnsPerPeer, Name: "router"})
	if tlsCfg != nil {
		out = tls.NewListener(out, tlsCfg)
	}
	return out, nil
}

// securityFlags bind the router's security keys to its command line (the
// role's Flags gain them at init, so router.go's list stays the router's).
var securityFlags = []config.Flag{
	{Key: "router.api_key", Name: "api-key"},
	{Key: "router.api_keys_file", Name: "api-keys-file"},
	{Key: "router.tls_cert", Name: "tls-cert"},
	{Key: "router.tls_key", Name: "tls-key"},
	{Key: "router.max_concurrent_per_key", Name: "max-concurrent-per-key"},
	{Key: "security.secret_file", Name: "secret-file"},
	{Key: "security.pd_token_file", Name: "pd-token-file"},
}

func init() { Flags = append(Flags, securityFlags...) }

// PDToken is the bearer token the router presents to the decode nodes'
// /pd/* (the first of security.pd_token_file, else derived from the
// shared secret); "" when neither is configured.
func PDToken(cfg *config.Config) (string, error) {
	toks, err := cfg.PDTokens()
	if err != nil || len(toks) == 0 {
		return "", err
	}
	return toks[0], nil
}

// pdAuth adds the router's /pd/* token to a request for a decode node.
func (rt *Router) pdAuth(h http.Header) {
	if rt.opts.PDToken != "" {
		h.Set("Authorization", "Bearer "+rt.opts.PDToken)
	}
}
