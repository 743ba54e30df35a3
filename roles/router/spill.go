package router

import (
	"bufio"
	"bytes"
	"context"
	"io"
	"net/http"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/tilert-go/tilert/internal/fastserve"
	"github.com/tilert-go/tilert/openai"
)

// spillTo proxies the request unchanged to --spill-url (a native vLLM P/D
// endpoint) and relays its answer, streamed or not. It counts the reason.
func (rt *Router) spillTo(c *fasthttp.RequestCtx, body []byte, reason, ep string, t0 time.Time) {
	rt.m.spilled.With(reason).Inc()
	ctx, watch := fastserve.WatchConn(context.Background(), c.Conn())
	hreq, err := http.NewRequestWithContext(ctx, http.MethodPost, rt.spill+string(c.Path()), bytes.NewReader(body))
	if err != nil {
		watch.Close()
		watch.Cancel()
		writeError(c, &openai.Error{Status: http.StatusInternalServerError, Type: "internal_error", Message: err.Error()})
		rt.count(ep, outcomeSpilled, t0)
		return
	}
	hreq.Header.Set("Content-Type", "application/json")
	if a := c.Request.Header.Peek("Authorization"); len(a) > 0 {
		hreq.Header.Set("Authorization", string(a))
	}
	resp, err := rt.client.Do(hreq)
	if err != nil {
		closeConn := watch.Close()
		watch.Cancel()
		if closeConn {
			c.SetConnectionClose()
		}
		writeError(c, upstreamErr(http.StatusBadGateway, "spill_unavailable", "the spill endpoint %s is unreachable: %v", rt.spill, err))
		rt.count(ep, outcomeSpilled, t0)
		return
	}
	c.SetStatusCode(resp.StatusCode)
	for _, h := range []string{"Content-Type", "Retry-After", "Cache-Control"} {
		if v := resp.Header.Get(h); v != "" {
			c.Response.Header.Set(h, v)
		}
	}
	c.SetBodyStreamWriter(func(w *bufio.Writer) {
		defer rt.count(ep, outcomeSpilled, t0)
		defer watch.Cancel()
		defer watch.Close()
		defer resp.Body.Close()
		buf := make([]byte, 16<<10)
		for {
			n, err := resp.Body.Read(buf)
			if n > 0 {
				if _, werr := w.Write(buf[:n]); werr != nil || w.Flush() != nil {
					return // the client left: closing the body ends the upstream request
				}
			}
			if err != nil {
				if err != io.EOF {
					rt.log.Warn("router: spill answer broke off", "err", err.Error())
				}
				return
			}
		}
	})
}
