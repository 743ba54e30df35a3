// Package floodtest holds what the flood tests of every listener (ctrl,
// transfer data, node http, sidecar socket, router) share: the heap figure
// they bound, the slowloris trickle and the check that the server cut each
// flooding connection.
// Tests import it; nothing else does.
package floodtest

import (
	"errors"
	"io"
	"net"
	"runtime"
	"sync"
	"syscall"
	"testing"
	"time"
)

// HeapInUse is the live heap after a collection, the figure a flood test
// compares before and during the flood.
func HeapInUse() uint64 {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapInuse
}

// HeapBounded fails t when the heap grew by more than limit bytes between
// before and held while conns flooding connections were open.
func HeapBounded(t testing.TB, conns int, before, held uint64, limit int64) {
	t.Helper()
	grown := int64(held) - int64(before)
	t.Logf("flood of %d connections: heap %+d KiB", conns, grown>>10)
	if grown > limit {
		t.Fatalf("the flood holds %d MiB (bound %d MiB)", grown>>20, limit>>20)
	}
}

// AllClosed reads every flooding connection until the server closes it and
// fails t for one still open after within: the server, not the client, must
// cut them (read deadlines, idle deadlines, caps).
func AllClosed(t testing.TB, conns []net.Conn, within time.Duration) {
	t.Helper()
	deadline := time.Now().Add(within)
	for i, c := range conns {
		_ = c.SetReadDeadline(deadline)
		if _, err := io.Copy(io.Discard, c); err != nil && !errors.Is(err, syscall.ECONNRESET) {
			t.Fatalf("flooding connection %d not closed by the server: %v", i, err)
		}
		_ = c.Close()
	}
}

// OtherPeer is a dialer from 127.0.0.2, so a flood counts against a peer of
// its own and the per-peer caps can be told from the total ones; the test is
// skipped where that address is not available.
func OtherPeer(t testing.TB, addr string) net.Dialer {
	t.Helper()
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, 2)}}
	c, err := d.Dial("tcp", addr)
	if err != nil {
		t.Skipf("no second loopback address: %v", err)
	}
	_ = c.Close()
	return d
}

// Trickler drives slowloris connections: every connection started gets one
// byte of its script every 100 ms, slow enough that only the server's
// deadlines can end it, until Stop, a failed write or the script's end.
type Trickler struct {
	stop chan struct{}
	wg   sync.WaitGroup
}

// NewTrickler returns a Trickler with nothing started.
func NewTrickler() *Trickler { return &Trickler{stop: make(chan struct{})} }

// Start trickles script into c one byte a tick; with forever it starts over
// at the script's end.
func (tr *Trickler) Start(c net.Conn, script []byte, forever bool) {
	tr.wg.Add(1)
	go func() {
		defer tr.wg.Done()
		for k := 0; forever || k < len(script); k++ {
			select {
			case <-tr.stop:
				return
			case <-time.After(100 * time.Millisecond):
			}
			if _, err := c.Write(script[k%len(script) : k%len(script)+1]); err != nil {
				return
			}
		}
	}()
}

// Stop ends every trickle and waits for them.
func (tr *Trickler) Stop() {
	close(tr.stop)
	tr.wg.Wait()
}
