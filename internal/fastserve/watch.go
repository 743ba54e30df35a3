package fastserve

import (
	"context"
	"errors"
	"net"
	"os"
	"sync"
	"time"
)

// Client-gone detection. net/http notices a client that hangs up because
// its server keeps reading every connection in the background; fasthttp
// reads a connection only between requests, so while a handler waits (for
// a queue slot, a prefill, a node's state) or a body stream writer sleeps
// between lines, a departed client shows only at the next failed write.
// A Watch closes that gap: one goroutine blocks in a one-byte Read on the
// connection. An HTTP/1.1 client waiting for its answer sends nothing, so
// the Read returns only when the client closes (EOF or reset: gone, the
// context is cancelled) or when the watch is closed (a read deadline in the
// past wakes it). A byte that does arrive is a pipelined next request that
// the watch cannot hand back: Close then says to close the connection after
// this answer, and the client resends it on a new connection, as HTTP
// allows for an unanswered pipelined request. Close the watch before the
// handler returns the connection to fasthttp, so the two never read at once.

// Watch watches one connection while its request is being answered.
type Watch struct {
	conn      net.Conn
	cancel    context.CancelFunc
	done      chan struct{}
	once      sync.Once
	mu        sync.Mutex // orders the watcher's and Close's deadline changes
	stopped   bool
	pipelined bool
}

// WatchConn starts watching conn (a RequestCtx's Conn()); the returned
// context ends when the client goes away or parent ends.
func WatchConn(parent context.Context, conn net.Conn) (context.Context, *Watch) {
	ctx, cancel := context.WithCancel(parent)
	w := &Watch{conn: conn, cancel: cancel, done: make(chan struct{})}
	if conn == nil {
		close(w.done)
		return ctx, w
	}
	go w.run()
	return ctx, w
}

func (w *Watch) run() {
	defer close(w.done)
	var b [1]byte
	for {
		// The server's read deadline bounds reading a request, not this
		// wait: clear it (again after a deadline someone else set), unless
		// Close has begun.
		w.mu.Lock()
		if w.stopped {
			w.mu.Unlock()
			return
		}
		_ = w.conn.SetReadDeadline(time.Time{})
		w.mu.Unlock()
		n, err := w.conn.Read(b[:])
		if n > 0 {
			w.pipelined = true
			return
		}
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() || errors.Is(err, os.ErrDeadlineExceeded) {
			continue // Close's deadline (the loop top returns) or a stale one
		}
		w.cancel() // EOF or reset: the client is gone
		return
	}
}

// Close stops the watch and waits for its goroutine; it reports whether
// the connection must be closed after this answer (a pipelined request was
// read). The context stays uncancelled if the client is still there.
func (w *Watch) Close() (closeConn bool) {
	w.once.Do(func() {
		if w.conn != nil {
			w.mu.Lock()
			w.stopped = true
			_ = w.conn.SetReadDeadline(time.Unix(1, 0)) // wakes the Read
			w.mu.Unlock()
		}
		<-w.done
		if w.conn != nil {
			_ = w.conn.SetReadDeadline(time.Time{})
		}
	})
	return w.pipelined
}

// Cancel cancels the watch's context (the request is over, or its caller
// gives up), releasing what waits on it.
func (w *Watch) Cancel() { w.cancel() }
