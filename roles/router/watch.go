package router

import (
	"context"
	"errors"
	"net"
	"os"
	"sync"
	"time"
)

// Client-gone detection on fasthttp.
//
// net/http cancels a request's context when its connection closes because
// its server keeps reading the connection in the background. fasthttp does
// not: while a handler (or its body stream writer) runs, nobody reads the
// connection, and the only sign of a client that left is a failed write,
// which for a stream that is waiting (queue, prefill, a slow node) may not
// come for a long time. So the router watches the connection itself: one
// goroutine per generation request blocks in a one-byte Read on the
// connection. An HTTP/1.1 client that waits for its answer sends nothing,
// so the Read returns only when the client closes (EOF or reset: gone) or
// when the watch is stopped (a read deadline in the past wakes it). Bytes
// that do arrive are a pipelined next request, which the watch cannot put
// back: it marks the connection to be closed after this answer, and the
// client sends that request again on a new connection, as HTTP allows for
// an unanswered pipelined request. The watch stops before the handler
// hands the connection back to fasthttp, so it never competes with
// fasthttp's own reads.
type clientWatch struct {
	conn      net.Conn
	cancel    context.CancelFunc
	stop      chan struct{}
	done      chan struct{}
	once      sync.Once
	pipelined bool
}

// watchClient starts watching conn; the returned context ends when the
// client goes away (or when parent ends). Call stop before the connection
// is used for the next request.
func watchClient(parent context.Context, conn net.Conn) (context.Context, *clientWatch) {
	ctx, cancel := context.WithCancel(parent)
	w := &clientWatch{conn: conn, cancel: cancel, stop: make(chan struct{}), done: make(chan struct{})}
	if conn == nil {
		close(w.done)
		return ctx, w
	}
	_ = conn.SetReadDeadline(time.Time{}) // the server's read timeout is for reading requests
	go w.run()
	return ctx, w
}

func (w *clientWatch) run() {
	defer close(w.done)
	var b [1]byte
	for {
		n, err := w.conn.Read(b[:])
		select {
		case <-w.stop:
			return
		default:
		}
		if n > 0 {
			w.pipelined = true
			return
		}
		if err != nil {
			if errors.Is(err, os.ErrDeadlineExceeded) {
				continue // a deadline set by someone else; keep watching
			}
			w.cancel() // EOF or reset: the client is gone
			return
		}
	}
}

// close stops the watch and waits for its goroutine; it reports whether
// the connection must be closed after this answer (a pipelined request was
// read). The context stays valid (not cancelled) if the client is still
// there.
func (w *clientWatch) close() (closeConn bool) {
	w.once.Do(func() {
		close(w.stop)
		if w.conn != nil {
			_ = w.conn.SetReadDeadline(time.Unix(1, 0)) // wakes the Read
		}
		<-w.done
		if w.conn != nil {
			_ = w.conn.SetReadDeadline(time.Time{})
		}
	})
	return w.pipelined
}
