// Package fastserve is the one HTTP server stack of tilert's servers
// (valyala/fasthttp): a route table built once with method checks, JSON
// answers, a slog adapter for fasthttp's logger, and serving a listener
// until a context ends with a graceful shutdown. docs/ARCHITECTURE.md
// ("HTTP") says why fasthttp and how a streaming handler sees its client go.
package fastserve

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net"
	"time"

	"github.com/cockroachdb/errors"
	"github.com/valyala/fasthttp"
)

// Route is one endpoint: the method it takes (GET also answers HEAD) and
// its handler.
type Route struct {
	Method  string
	Handler fasthttp.RequestHandler
}

// Refuse writes a refusal in the server's own error shape: status 404 or
// 405, and a message naming the path (and, for 405, the method to use).
type Refuse func(ctx *fasthttp.RequestCtx, status int, msg string)

// Routes returns a handler dispatching by exact path over routes; unknown
// paths and wrong methods go to refuse (405 answers carry Allow).
func Routes(routes map[string]Route, refuse Refuse) fasthttp.RequestHandler {
	table := make(map[string]Route, len(routes))
	for p, r := range routes {
		table[p] = r
	}
	return func(ctx *fasthttp.RequestCtx) {
		path := string(ctx.Path())
		rt, ok := table[path]
		switch {
		case !ok:
			refuse(ctx, fasthttp.StatusNotFound, "no endpoint "+path)
		case string(ctx.Method()) != rt.Method && !(rt.Method == fasthttp.MethodGet && ctx.IsHead()):
			ctx.Response.Header.Set("Allow", rt.Method)
			refuse(ctx, fasthttp.StatusMethodNotAllowed, path+" takes "+rt.Method)
		default:
			rt.Handler(ctx)
		}
	}
}

// WriteJSON answers status with v as a JSON body (one line).
func WriteJSON(ctx *fasthttp.RequestCtx, status int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		status, b = fasthttp.StatusInternalServerError, []byte(`{"error":"internal","message":"encoding the answer failed"}`)
	}
	ctx.SetStatusCode(status)
	ctx.SetContentType("application/json")
	ctx.SetBody(append(b, '\n'))
}

// Logger adapts fasthttp's logger to slog at debug level, prefixed by name.
type Logger struct {
	Log  *slog.Logger
	Name string
}

// Printf implements fasthttp.Logger.
func (l Logger) Printf(format string, args ...any) {
	log := l.Log
	if log == nil {
		log = slog.Default()
	}
	log.Debug(l.Name + ": http: " + fmt.Sprintf(format, args...))
}

// Serve serves srv on ln until ctx ends, then shuts down, giving requests
// in flight grace to finish. It returns the serve error, if serving stopped
// before ctx did.
func Serve(ctx context.Context, srv *fasthttp.Server, ln net.Listener, grace time.Duration) error {
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	select {
	case err := <-errc:
		return errors.Wrapf(err, "%s: serve", srv.Name)
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), grace)
	defer cancel()
	_ = srv.ShutdownWithContext(sctx)
	return nil
}

// Started is a server serving its own listener in the background (tests
// and in-process stacks).
type Started struct {
	URL  string // http://host:port
	srv  *fasthttp.Server
	done chan struct{}
}

// Start listens on addr ("127.0.0.1:0" picks a port) and serves srv there.
func Start(srv *fasthttp.Server, addr string) (*Started, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, errors.Wrapf(err, "%s: listen on %s", srv.Name, addr)
	}
	s := &Started{URL: "http://" + ln.Addr().String(), srv: srv, done: make(chan struct{})}
	go func() {
		defer close(s.done)
		_ = srv.Serve(ln)
	}()
	return s, nil
}

// Close shuts the server down and waits for it.
func (s *Started) Close() {
	_ = s.srv.Shutdown()
	<-s.done
}
