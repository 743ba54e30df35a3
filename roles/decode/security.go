package decode

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/tilert-go/tilert/api/decodeapi"
	"github.com/tilert-go/tilert/config"
	"github.com/tilert-go/tilert/internal/auth"
	"github.com/tilert-go/tilert/internal/fastserve"
	"github.com/tilert-go/tilert/internal/netguard"
	"github.com/tilert-go/tilert/pd"
)

// Security is what the node's ports enforce (config's [security] section).
// Zero values take its defaults.
type Security struct {
	// Ctrl is the ctrl port's authentication and limits; its Secret is
	// also the transfer engine's (rdma/transfer.NewReceiver).
	Ctrl pd.Security
	// Tokens are the bearer tokens /pd/* accepts; none configured: /pd/*
	// takes anyone (a node without a secret binds to loopback by default).
	Tokens *auth.Tokens
	// MaxRIDBytes caps rids (128); CancelledRIDs the cancelled rids kept (65536).
	MaxRIDBytes, CancelledRIDs int
	// MaxBodyBytes (64 KiB: a /pd/* body is a few hundred bytes) and
	// MaxHeaderBytes (16 KiB) cap a request; fasthttp may allocate the
	// declared body size up front, so the cap bounds a half-sent body.
	MaxBodyBytes, MaxHeaderBytes int
}

func (s *Security) defaults() {
	if s.MaxRIDBytes <= 0 {
		s.MaxRIDBytes = 128
	}
	if s.CancelledRIDs <= 0 {
		s.CancelledRIDs = 65536
	}
	if s.MaxBodyBytes <= 0 {
		s.MaxBodyBytes = 64 << 10
	}
	if s.MaxHeaderBytes <= 0 {
		s.MaxHeaderBytes = 16 << 10
	}
	s.Ctrl.Defaults()
}

// SecurityFrom builds the node's Security from the configuration: it
// loads the secret and the /pd/* tokens.
func SecurityFrom(cfg *config.Config) (Security, error) {
	s := cfg.Security
	secret, err := cfg.Secret()
	if err != nil {
		return Security{}, err
	}
	toks, err := cfg.PDTokens()
	if err != nil {
		return Security{}, err
	}
	return Security{
		Ctrl: pd.Security{Secret: secret, MaxConns: s.MaxConns, MaxConnsPerPeer: s.MaxConnsPerPeer,
			ReadTimeout: s.ReadTimeout(), IdleTimeout: s.IdleTimeout(), WriteTimeout: s.WriteTimeout(),
			MaxFrame: s.MaxFrameBytes, AdmitsPerS: s.AdmitsPerS},
		Tokens:      auth.NewTokens(toks...),
		MaxRIDBytes: s.MaxRIDBytes, CancelledRIDs: s.CancelledRIDs,
		MaxBodyBytes: s.MaxBodyBytes, MaxHeaderBytes: s.MaxHeaderBytes,
	}, nil
}

// anonymous is the caller of a request without a valid token.
const anonymous = -1

// caller identifies who sent a request: the index of its bearer token, or
// anonymous. With tokens configured, /pd/* refuses anonymous callers.
func (n *Node) caller(ctx *fasthttp.RequestCtx) int {
	if !n.sec.Tokens.Enabled() {
		return anonymous
	}
	return n.sec.Tokens.Check(auth.Bearer(ctx.Request.Header.Peek("Authorization")))
}

// authorize answers 401 for /pd/* without a valid token when tokens are
// configured; it reports whether the handler may run.
func (n *Node) authorize(ctx *fasthttp.RequestCtx, path string) bool {
	if !strings.HasPrefix(path, "/pd/") || !n.sec.Tokens.Enabled() || n.caller(ctx) != anonymous {
		return true
	}
	ctx.Response.Header.Set("WWW-Authenticate", `Bearer realm="tilert-decode"`)
	n.reject(ctx, &decodeapi.Error{Code: decodeapi.CodeUnauthorized,
		Message: "this endpoint wants Authorization: Bearer <token> (the router's, security.pd_token_file or derived from security.secret_file)"})
	return false
}

// checkRID refuses an over-long or non-printable rid, naming the limit.
func (n *Node) checkRID(rid string) *decodeapi.Error {
	if err := pd.CheckRID(rid, n.sec.MaxRIDBytes, "security.max_rid_bytes"); err != nil {
		return badRequest("field rid: %v", err)
	}
	return nil
}

// maskRID shortens a rid for callers that may not see it whole: a rid is a
// capability (whoever knows it may decode the state it names).
func maskRID(rid string) string {
	if rid == "" {
		return ""
	}
	return rid[:min(6, len(rid)/3)] + "…"
}

// watchClient notices a client that goes away while its request waits for
// state or decodes without writing (stream=false): fasthttp reads nothing
// from a connection while its handler runs, so a read here returns only
// when the client closes (or pipelines a next request, which the router
// never does; that connection is then closed after this response). gone
// runs once when the client left. stop ends the watch and must run before
// the final bytes of the response are written, so the client's next
// request is never read here.
func watchClient(ctx *fasthttp.RequestCtx, gone func()) (stop func()) {
	wctx, w := fastserve.WatchConn(context.Background(), ctx.Conn())
	stopGone := context.AfterFunc(wctx, gone)
	return func() {
		stopGone()
		if w.Close() {
			ctx.SetConnectionClose()
		}
	}
}

// limitListener applies the connection caps to the http port.
func (n *Node) limitListener(ln net.Listener) net.Listener {
	g := netguard.Wrap(ln, netguard.Limits{MaxConns: n.sec.Ctrl.MaxConns, MaxPerPeer: n.sec.Ctrl.MaxConnsPerPeer, Name: "decode http"})
	n.httpGuard.Store(g)
	return g
}

// writeDeadline bounds the next write of a streamed response.
func (n *Node) writeDeadline(c net.Conn) {
	if c != nil {
		_ = c.SetWriteDeadline(time.Now().Add(n.sec.Ctrl.WriteTimeout))
	}
}

// httpError answers a request fasthttp could not read, in the node's error
// shape and naming the limit that refused it.
func (n *Node) httpError(ctx *fasthttp.RequestCtx, err error) {
	var small *fasthttp.ErrSmallBuffer
	var ne net.Error
	var e *decodeapi.Error
	switch {
	case errors.As(err, &small):
		e = &decodeapi.Error{Code: decodeapi.CodeHeaderTooLarge, Message: fmt.Sprintf("request headers exceed security.max_header_bytes (%d)", n.sec.MaxHeaderBytes)}
	case errors.Is(err, fasthttp.ErrBodyTooLarge):
		e = &decodeapi.Error{Code: decodeapi.CodeTooLarge, Message: fmt.Sprintf("request body exceeds security.max_body_bytes (%d)", n.sec.MaxBodyBytes)}
	case errors.As(err, &ne) && ne.Timeout():
		e = &decodeapi.Error{Code: decodeapi.CodeTimeout, Message: fmt.Sprintf("the request did not arrive within security.read_timeout_s (%s)", n.sec.Ctrl.ReadTimeout)}
	default:
		e = badRequest("unreadable HTTP request: %v", err)
	}
	n.m.rejects.With("http", string(e.Code)).Inc()
	writeError(ctx, e)
}
