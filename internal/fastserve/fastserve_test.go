package fastserve

import (
	"context"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/valyala/fasthttp"
)

func TestRoutes(t *testing.T) {
	h := Routes(map[string]Route{
		"/a": {Method: fasthttp.MethodGet, Handler: func(ctx *fasthttp.RequestCtx) { ctx.SetBodyString("a") }},
		"/b": {Method: fasthttp.MethodPost, Handler: func(ctx *fasthttp.RequestCtx) { WriteJSON(ctx, 201, map[string]int{"b": 1}) }},
	}, func(ctx *fasthttp.RequestCtx, status int, msg string) {
		WriteJSON(ctx, status, map[string]string{"error": msg})
	})
	for _, tc := range []struct {
		method, path string
		status       int
		body, allow  string
	}{
		{"GET", "/a", 200, "a", ""},
		{"HEAD", "/a", 200, "", ""},
		{"POST", "/b", 201, `{"b":1}`, ""},
		{"GET", "/b", 405, "/b takes POST", "POST"},
		{"GET", "/nope", 404, "no endpoint /nope", ""},
	} {
		var ctx fasthttp.RequestCtx
		ctx.Request.Header.SetMethod(tc.method)
		ctx.Request.SetRequestURI(tc.path)
		h(&ctx)
		if got := ctx.Response.StatusCode(); got != tc.status {
			t.Errorf("%s %s: status %d, want %d", tc.method, tc.path, got, tc.status)
		}
		if !strings.Contains(string(ctx.Response.Body()), tc.body) {
			t.Errorf("%s %s: body %q lacks %q", tc.method, tc.path, ctx.Response.Body(), tc.body)
		}
		if got := string(ctx.Response.Header.Peek("Allow")); got != tc.allow {
			t.Errorf("%s %s: Allow %q, want %q", tc.method, tc.path, got, tc.allow)
		}
	}
}

func TestWatch(t *testing.T) {
	t.Run("client leaves", func(t *testing.T) {
		srv, cli := net.Pipe()
		ctx, w := WatchConn(context.Background(), srv)
		_ = cli.Close()
		select {
		case <-ctx.Done():
		case <-time.After(5 * time.Second):
			t.Fatal("the context did not end when the client closed")
		}
		if w.Close() {
			t.Error("Close reports a pipelined request that was never sent")
		}
	})
	t.Run("client waits", func(t *testing.T) {
		srv, cli := net.Pipe()
		defer cli.Close()
		ctx, w := WatchConn(context.Background(), srv)
		time.Sleep(20 * time.Millisecond)
		if w.Close() {
			t.Error("Close reports a pipelined request that was never sent")
		}
		if ctx.Err() != nil {
			t.Errorf("context ended for a client still there: %v", ctx.Err())
		}
	})
	t.Run("pipelined request", func(t *testing.T) {
		srv, cli := net.Pipe()
		defer cli.Close()
		ctx, w := WatchConn(context.Background(), srv)
		go func() { _, _ = cli.Write([]byte("G")) }()
		deadline := time.Now().Add(5 * time.Second)
		for !w.pipelinedSeen() && time.Now().Before(deadline) {
			time.Sleep(time.Millisecond)
		}
		if !w.Close() {
			t.Error("Close does not ask to close the connection after a pipelined byte")
		}
		if ctx.Err() != nil {
			t.Errorf("context ended for a client still there: %v", ctx.Err())
		}
	})
}

// pipelinedSeen reports whether the watch goroutine has ended (tests).
func (w *Watch) pipelinedSeen() bool {
	select {
	case <-w.done:
		return true
	default:
		return false
	}
}
