package router

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/cockroachdb/errors"
)

// Text that may begin a stop string is held back until it cannot; the
// stop string itself never leaks, whatever the piece boundaries.
func TestTextStreamHoldBack(t *testing.T) {
	for _, tc := range []struct {
		name    string
		stops   []string
		include bool
		pieces  []string
		emitted []string // per piece
		final   string   // finish()
		stopped bool
	}{
		{"no stops", nil, false, []string{"ab", "c"}, []string{"ab", "c"}, "", false},
		{"split stop", []string{"END"}, false, []string{"abE", "N", "Dzz"}, []string{"ab", "", ""}, "", true},
		{"false alarm", []string{"END"}, false, []string{"abE", "Nx"}, []string{"ab", "ENx"}, "", false},
		{"held at finish", []string{"END"}, false, []string{"abEN"}, []string{"ab"}, "EN", false},
		{"include stop", []string{"END"}, true, []string{"abEN", "Dx"}, []string{"ab", "END"}, "", true},
		{"earliest wins", []string{"cd", "b"}, false, []string{"abcd"}, []string{"a"}, "", true},
		{"same start longest", []string{"b", "bc"}, true, []string{"abcd"}, []string{"abc"}, "", true},
		{"stop in one piece", []string{"\n\n"}, false, []string{"x\n", "\ny"}, []string{"x", ""}, "", true},
		{"overlapping prefixes", []string{"aab"}, false, []string{"aa", "a", "b"}, []string{"", "a", ""}, "", true},
		{"multibyte", []string{"é!"}, false, []string{"caf", "é", "?"}, []string{"caf", "", "é?"}, "", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := &textStream{stops: tc.stops, includeStop: tc.include}
			for i, p := range tc.pieces {
				if got := s.push(p); got != tc.emitted[i] {
					t.Fatalf("piece %d %q: emitted %q, want %q", i, p, got, tc.emitted[i])
				}
				if s.stopped {
					break
				}
			}
			if s.stopped != tc.stopped {
				t.Fatalf("stopped %v, want %v", s.stopped, tc.stopped)
			}
			if !s.stopped {
				if got := s.held; got != tc.final {
					t.Fatalf("held at the end %q, want %q", got, tc.final)
				}
			}
			for _, st := range tc.stops {
				if !tc.include && strings.Contains(strings.Join(tc.emitted, ""), st) {
					t.Fatalf("stop %q leaked", st)
				}
			}
		})
	}
}

func TestGateFIFO(t *testing.T) {
	a, b := &node{spec: "a", slots: 1, up: true}, &node{spec: "b", slots: 2, up: true}
	g := newGate([]*node{a, b}, 2)
	ctx := context.Background()
	var got []*node
	for range 3 {
		n, err := g.acquire(ctx, time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, n)
	}
	// Most free slots first: b (2 free), then a or b (1 each), then the other.
	if got[0] != b || a.inflight != 1 || b.inflight != 2 {
		t.Fatalf("placement %s, a %d b %d", got[0].spec, a.inflight, b.inflight)
	}
	w1, w2 := make(chan *node), make(chan *node)
	go func() { n, _ := g.acquire(ctx, time.Hour); w1 <- n }()
	for g.queued() != 1 {
		time.Sleep(time.Millisecond)
	}
	go func() { n, _ := g.acquire(ctx, time.Hour); w2 <- n }()
	for g.queued() != 2 {
		time.Sleep(time.Millisecond)
	}
	if _, err := g.acquire(ctx, time.Hour); !errors.Is(err, errQueueFull) {
		t.Fatalf("third waiter: %v, want queue full", err)
	}
	g.release(a)
	if n := <-w1; n != a {
		t.Fatalf("the oldest waiter got %s", n.spec)
	}
	g.release(b)
	if n := <-w2; n != b {
		t.Fatalf("the second waiter got %s", n.spec)
	}
	if a.inflight != 1 || b.inflight != 2 {
		t.Fatalf("handover changed counts: a %d b %d", a.inflight, b.inflight)
	}
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := g.acquire(cctx, time.Hour); !errors.Is(err, context.Canceled) || g.queued() != 0 {
		t.Fatalf("cancelled waiter: %v, queued %d", err, g.queued())
	}
	if _, err := g.acquire(ctx, time.Millisecond); !errors.Is(err, errQueueTimeout) || g.queued() != 0 {
		t.Fatalf("timed out waiter: %v, queued %d", err, g.queued())
	}
}

func TestParseNode(t *testing.T) {
	for _, tc := range []struct {
		in, host, url string
		ctrl          int
		bad           bool
	}{
		{in: "decode-node:5556:5557", host: "decode-node", ctrl: 5556, url: "http://decode-node:5557"},
		{in: "[::1]:1:2", host: "::1", ctrl: 1, url: "http://[::1]:2"},
		{in: "node:5557", bad: true},
		{in: ":1:2", bad: true},
		{in: "h:x:2", bad: true},
		{in: "h:1:70000", bad: true},
	} {
		n, err := parseNode(tc.in)
		if tc.bad {
			if err == nil {
				t.Errorf("%q: accepted", tc.in)
			}
			continue
		}
		if err != nil || n.host != tc.host || n.ctrlPort != tc.ctrl || n.httpURL != tc.url {
			t.Errorf("%q: %+v %v", tc.in, n, err)
		}
	}
}

// Down nodes take no requests; with none up, new requests and waiters are
// told errNoNodes at once; a node coming back serves the queue.
func TestGateHealth(t *testing.T) {
	a, b := &node{spec: "a", slots: 1, up: true}, &node{spec: "b", slots: 1, up: true}
	g := newGate([]*node{a, b}, 4)
	ctx := context.Background()
	g.setUp(a, false, "test")
	n, err := g.acquire(ctx, time.Hour)
	if err != nil || n != b {
		t.Fatalf("with a down: got %v %v, want b", n, err)
	}
	w := make(chan error, 1)
	go func() { _, err := g.acquire(ctx, time.Hour); w <- err }()
	for g.queued() != 1 {
		time.Sleep(time.Millisecond)
	}
	g.setUp(b, false, "test")
	if err := <-w; !errors.Is(err, errNoNodes) {
		t.Fatalf("waiter when the last node went down: %v", err)
	}
	if _, err := g.acquire(ctx, time.Hour); !errors.Is(err, errNoNodes) {
		t.Fatalf("new request with no node up: %v", err)
	}
	g.release(b) // the request on b ends; b is down, so nothing is handed over
	if _, total := g.busy(); total != 0 {
		t.Fatalf("slots of down nodes counted: %d", total)
	}
	go func() { n, err := g.acquire(ctx, time.Hour); _ = n; w <- err }()
	time.Sleep(5 * time.Millisecond) // no node up: the waiter was refused, not queued
	if err := <-w; !errors.Is(err, errNoNodes) {
		t.Fatalf("%v", err)
	}
	g.setUp(a, true, "")
	if n, err := g.acquire(ctx, time.Hour); err != nil || n != a {
		t.Fatalf("after a came back: %v %v", n, err)
	}
	go func() { _, err := g.acquire(ctx, time.Hour); w <- err }()
	for g.queued() != 1 {
		time.Sleep(time.Millisecond)
	}
	g.setUp(b, true, "") // b's free slot goes to the waiter at once
	if err := <-w; err != nil || b.inflight != 1 {
		t.Fatalf("waiter when b came back: %v, b inflight %d", err, b.inflight)
	}
}
